"""Project a program's step time and cost on Trainium and GPU instances from its counted work.

    with torchneuron.projection.count(fake=True) as p:
        ... one or more training steps ...
        p.step(tokens=batch * seq)
    print(p.project(["trn2.48xlarge"], compare=["p5.48xlarge"]).format())

``counting`` records the work of each kernel, ``model`` turns it into time on a target described
in ``hardware.json`` (every number with its source), ``report`` assembles the projection,
``serving`` projects prefill and decode, ``schedule`` what a vLLM engine scheduled, ``models`` builds Llama- and Whisper-style models from a
config for counting without allocating, ``validation`` compares projections with published figures.
Every output is a projection, not a measurement.
"""

from torchneuron.projection.counting import CountingMode, OpRecord, StepCounts, fake_mode, summarize
from torchneuron.projection.model import ModelHints, Parallelism, Target, get_target, load_hardware, step_time, targets
from torchneuron.projection.report import LABEL, Projection, Report, count, declare, mark_step, run_script
from torchneuron.projection.schedule import Schedule, project_schedule
from torchneuron.projection.serving import project_serving, project_transcription

__all__ = [
    "CountingMode", "OpRecord", "StepCounts", "fake_mode", "summarize", "ModelHints", "Parallelism", "Target",
    "get_target", "load_hardware", "step_time", "targets", "LABEL", "Projection", "Report", "count", "mark_step",
    "run_script", "project_serving", "project_transcription", "declare", "Schedule", "project_schedule",
]
