"""nblib.publish.runindex: lanes writing one run index at once lose no record."""

import json

from index_writers import write_records


def test_lanes_writing_one_index_lose_no_record(tmp_path):
    import multiprocessing

    names = [[f"{lane}{i:03d}" for i in range(60)] for lane in "ab"]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=write_records, args=(tmp_path, n, barrier)) for n in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    index = json.loads((tmp_path / "index.json").read_text())["notebooks"]
    assert sorted(r["notebook"] for r in index) == sorted(names[0] + names[1])
