"""What the model-parallel benchmarks read back from one trainer run (train_runs.sh's `run`)."""
import json
import re


def measure(work_dir, name, round_, untimed):
    """Milliseconds per step after `untimed` steps, the final loss, and the log's shares.

    rss_mib: the peak resident memory of a one-rank run (train_runs.sh's NAME.ROUND.rss), else 0.
    shares: the percentages the trainer's last line gives ("tensor-parallel collectives X%",
    "waiting for gradients X%", "pipeline waits X%"), 0 where it gives none.
    """
    run = f"{work_dir}/{name}.{round_}"
    metrics = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    start = metrics[untimed - 1]["elapsed_seconds"] if untimed > 0 else 0.0
    ms_per_step = 1000.0 * (metrics[-1]["elapsed_seconds"] - start) / (len(metrics) - untimed)
    log = open(f"{run}.log").read()

    def share(pattern):
        found = re.search(pattern + r" ([0-9.eE+-]+)%", log)
        return float(found.group(1)) if found else 0.0

    try:
        rss_mib = int(open(f"{run}.rss").read().split()[-1]) / 1024.0
    except (OSError, ValueError, IndexError):
        rss_mib = 0.0
    return {"ms": ms_per_step, "rss_mib": rss_mib, "tp": share("tensor-parallel collectives"),
            "wait": share("waiting for gradients"), "pp": share("pipeline waits"),
            "loss": metrics[-1]["loss"]}
