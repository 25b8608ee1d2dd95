"""What a reader must find on the page: every sentence a notebook computes (read from its
results.json), and the text an executed notebook or a published page shows (read from the .ipynb's
outputs or the page's HTML, never from results.json)."""

import html
import json
import re
from pathlib import Path

MARKUP = re.compile(r"[*`_]")  # markdown's emphasis and code marks: rendered, they are not text


def normal(text: str) -> str:
    """Text as a reader compares it: markdown marks dropped, a table's cell borders (markdown's |, or
    an HTML table's cells once its tags are dropped) as white space, white space collapsed."""
    return " ".join(MARKUP.sub("", text).replace("|", " ").split())


def _output_text(out) -> str:
    if out.get("output_type") == "stream":
        return "".join(out["text"])
    data = out.get("data", {})
    for mime in ("text/markdown", "text/plain"):
        if mime in data:
            return "".join(data[mime])
    if "text/html" in data:
        return text_of_html("".join(data["text/html"]))
    return ""


def displayed(ipynb: Path) -> str:
    """Everything an executed notebook's cells displayed (streams, markdown, plain text, HTML
    tables), normalised; code and markdown cells' sources are left out."""
    nb = json.loads(Path(ipynb).read_text())
    outs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    return normal(" ".join(_output_text(o) for o in outs))


def text_of_html(markup: str) -> str:
    """HTML's text as a reader sees it: tags dropped, entities decoded, white space collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def page_text(path: Path) -> str:
    """A page's text as a reader sees it (text_of_html of the file)."""
    return text_of_html(Path(path).read_text())


def page(path: Path) -> str:
    """A published page's text, normalised as displayed() is."""
    return normal(page_text(path))


def sentences(res: dict) -> list[tuple[str, str]]:
    """(what, sentence) for every conclusion notebook `res` computed: its verdict, and per notebook
    00's protocol and seed-block verdicts, 02's explanation, each design's reason and the campaign
    design's verdict, 03's graph, CSAN, hazard and forced-order sentences, 04's overlap story,
    micro-batch verdict and each check with what it measured."""
    out = [("verdict", res["verdict"])]
    nb = res["notebook"]
    if nb == "00_reproduce":
        out.append(("protocol verdict", res["protocol_verdict"]))
        if res.get("blocks_verdict"):
            out.append(("seed blocks verdict", res["blocks_verdict"]))
    elif nb == "02_graph_vs_eager":
        why = res["explanation"]
        out.append(("explanation", why["text"]))
        out += [(f"{f['design']}: why", f["why"]) for f in why["findings"]]
        if why["recommended"]:
            out.append(("recommended", why["recommended"]))
        if res.get("campaign_verdict"):
            out.append(("campaign verdict", res["campaign_verdict"]))
        if res.get("forced_verdict"):
            out.append(("forced-order verdict", res["forced_verdict"]))
    elif nb == "03_stream_overlap":
        out.append(("graph verdict", res["graph_verdict"]))
        out += [("hazard sentence", s) for s in res["hazard_sentences"]]
        if res.get("csan_verdict"):
            out.append(("CSAN verdict", res["csan_verdict"]))
        if res.get("forced_verdict"):
            out.append(("forced-order verdict", res["forced_verdict"]))
    elif nb == "04_persistent_buffer_fix":
        out.append(("overlap story", res["overlap_story"]))
        if res.get("micro_batches_verdict"):
            out.append(("micro-batch verdict", res["micro_batches_verdict"]))
        out += [(f"check: {c['check']}", f"{c['check']} {c['measured']}") for c in res["checks"]]
    return out


def missing(res: dict, text: str) -> list[str]:
    """The conclusions of `res` that `text` (displayed() or page()) does not show."""
    return [what for what, s in sentences(res) if normal(s) not in text]
