"""Run control: paging alerts become pause requests (a pure fold, hosted like the detectors)."""

from stream_processors.control.fold import RunControllerFold
from stream_processors.control.policy import ControlPolicy

__all__ = ["ControlPolicy", "RunControllerFold"]
