"""Figures for the notebooks; each returns a matplotlib Figure and saves nothing by itself."""
import matplotlib.pyplot as plt


def corruption_heatmap(rows, level="session"):
    """One line per (index dtype, mode, overlap), one column per bucket: the corrupted fraction,
    annotated with k/n. Clean cells are white, so the fingerprint reads at a glance."""
    configs = sorted({(r["index_dtype"], r["mode"], r["overlap"]) for r in rows})
    buckets = sorted({r["bucket"] for r in rows})
    key_k, key_n = (("corrupted_sessions", "sessions") if level == "session"
                    else ("corrupted_steps", "steps"))
    grid = [[float("nan")] * len(buckets) for _ in configs]
    fig, ax = plt.subplots(figsize=(1.2 * len(buckets) + 3, 0.5 * len(configs) + 1.5))
    for r in rows:
        i, j = configs.index((r["index_dtype"], r["mode"], r["overlap"])), buckets.index(r["bucket"])
        grid[i][j] = r[key_k] / r[key_n] if r[key_n] else float("nan")
        ax.text(j, i, f"{r[key_k]}/{r[key_n]}", ha="center", va="center", fontsize=8)
    im = ax.imshow(grid, cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(buckets)), [str(b) for b in buckets])
    ax.set_yticks(range(len(configs)), [f"{d} {m} overlap {o}" for d, m, o in configs])
    ax.set_xlabel("decode batch size (bucket)")
    ax.set_title(f"corrupted {level}s")
    fig.colorbar(im, ax=ax, label=f"fraction of {level}s corrupted")
    fig.tight_layout()
    return fig
