"""The short human report printed at the end of ``benchseal release --local``."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pipeline.core.errors import escape_text
from pipeline.local.release import ReleaseReport
from pipeline.publish.body import INLINE_TASKS


def render_report(report: ReleaseReport, console: Console) -> None:
    score = "not scored" if report.score is None else f"{report.score:.3f}"
    table = Table(title=f"benchseal {report.tag}: {report.status}", show_header=True)
    for column in ("score", "completed", "resolved", "unresolved", "infra errors", "total"):
        table.add_column(column, justify="right")
    counts = report.counts
    table.add_row(score, str(counts.get("completed")), str(counts.get("resolved")), str(counts.get("unresolved")),
                  str(counts.get("infra_errors")), str(counts.get("total")))
    console.print(table)
    if report.reason:
        console.print(escape_text(f"why     {report.reason}"), soft_wrap=True, highlight=False, markup=False)
    for trial in report.failed_trials[:INLINE_TASKS]:
        what = "canary (not scored)" if trial.get("canary") else str(trial.get("outcome"))
        console.print(escape_text(f"trial   {trial.get('task')} {what}: {trial.get('reason') or 'no reason recorded'}"),
                      soft_wrap=True, highlight=False, markup=False)
    if len(report.failed_trials) > INLINE_TASKS:
        console.print(f"trial   and {len(report.failed_trials) - INLINE_TASKS} more not resolved (every trial: "
                      f"{report.release_dir}/trial-results.json, per task: body.md and summary.json)",
                      soft_wrap=True, highlight=False, markup=False)
    for role, ref in sorted(report.images.items()):
        console.print(f"{role:7} {ref}", soft_wrap=True, highlight=False)
    console.print(f"images  {'reused (same digests as the last release run)' if report.images_reused else 'new digests (changed since the last release run)'}")
    console.print(f"run     {report.run_id}")
    if report.policy is not None:
        console.print(f"policy  {report.policy['path']} (the local infra policy: {report.policy['base']} + "
                      f"{len(report.policy['added'])} entries; sha256 {report.policy['sha256']})", soft_wrap=True,
                      highlight=False, markup=False)
    comparison = report.comparison
    if comparison is not None:
        previous = comparison.get("previous")
        if previous is None:
            console.print("history the repository's first scored release: nothing to compare with", highlight=False)
        else:
            changes = [f"{c['task']} {c['change']}" for c in comparison.get("changed", ())]
            more = len(changes) - INLINE_TASKS
            changed = (", ".join(changes[:INLINE_TASKS]) + (f", and {more} more (summary.json comparison)"
                                                            if more > 0 else "")) or "no task changed"
            console.print(escape_text(f"history vs {previous['tag']} (run {previous['run_id']}, score "
                                      f"{previous['score']:.3f}): delta {comparison['score_delta']:+.3f}; {changed}"),
                          soft_wrap=True, highlight=False, markup=False)
        if comparison.get("gated"):
            console.print(escape_text("GATED   " + "; ".join(comparison.get("reasons", ()))), soft_wrap=True,
                          highlight=False, markup=False)
    console.print(f"release {report.release_dir}  (body.md + {len(report.publication.get('assets', {}))} assets)",
                  soft_wrap=True, highlight=False)
    verified = report.verified
    console.print(f"verified: benchseal verify ok, {len(verified.get('cosign_commands', []))} sha256sum/cosign/"
                  "benchseal commands ok", soft_wrap=True, highlight=False)
    console.print(f"  as {verified.get('identity')} (issuer {verified.get('issuer')})", soft_wrap=True, highlight=False)
    if verified.get("workflow_repository"):  # a reusable workflow's signature: for which caller, at which ref
        console.print(f"  sealed for {verified.get('workflow_repository')} at {verified.get('workflow_ref')}",
                      soft_wrap=True, highlight=False)
    console.print(f"  for {verified.get('repository')} {verified.get('tag')} @ {verified.get('commit')}",
                  soft_wrap=True, highlight=False)
    for line in verified.get("images", []):
        console.print(f"cosign  {line}", soft_wrap=True, highlight=False)
    total = sum(v for v in report.stages.values() if v > 0)
    console.print("stages  " + ", ".join(f"{k} {v:.1f}s" for k, v in report.stages.items()) + f"  (total {total:.1f}s)",
                  soft_wrap=True, highlight=False)
