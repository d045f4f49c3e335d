"""A whole ablation: the steps its step log does not record as done (on one Ray, started here if a variant's job
needs it), then ``ablation.json`` and ``REPORT.md``. What ``tokenmill ablate`` and an ablation job of the
control plane (:mod:`service.runner.ablation_attempt`) both run.
"""

from __future__ import annotations

from typing import Any

from service.ablation.plan import Plan


def ablate(plan: Plan, stop_after: int | None = None) -> None:
    """Run the steps not done yet (on one Ray, started here if a job needs it), then write the results."""
    from service.ablation import report, results
    from service.ablation.runner import pending_jobs, run_steps

    started = False
    if pending_jobs(plan):
        from pipeline.job.ray_env import init_ray

        execution = next(iter(plan.jobs.values())).execution
        started = init_ray(execution.address, execution.num_cpus)
    try:
        run_steps(plan, say=lambda line: print(line, flush=True), stop_after=stop_after)
    finally:
        if started:
            import ray

            ray.shutdown()
    data = results.write(plan)
    path = report.write_report(plan, data)
    print(summary_line(data), flush=True)
    print(f"report: {path}", flush=True)


def summary_line(data: dict[str, Any]) -> str:
    """One line per variant: its mean common bits per byte and the seed spread."""
    lines = []
    for name, v in data["variants"].items():
        s = v["scores"].get("common")
        lines.append(f"{name}: common bpb " + (f"{s['mean']:.4f} (spread {s['spread']:.4f}, {s['n']} seeds)"
                                               if s else "-"))
    return "\n".join(lines)
