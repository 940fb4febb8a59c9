"""`cookmind demo`: every stage end to end on the embedded synthetic data, on a laptop CPU.

pipeline.py  the stages, the shared DemoContext, the report and the command line
curate.py    the first stage: a synthetic web crawl curated into clean text
rl.py        the RL stage: GRPO on fresh problems through the Trainer (``cookmind train``'s grpo objective)
curves.py    the RL stage's reward / accuracy / length curves
"""

from cookmind.demo.pipeline import (
    STAGES,
    DemoContext,
    DemoSizes,
    add_arguments,
    arithmetic_accuracy,
    main,
    run_demo,
    stage_curate,
    stage_report,
    write_demo_report,
)

__all__ = [
    "STAGES",
    "DemoContext",
    "DemoSizes",
    "add_arguments",
    "arithmetic_accuracy",
    "main",
    "run_demo",
    "stage_curate",
    "stage_report",
    "write_demo_report",
]
