"""Importing this module makes ``"runwatch"`` a verl tracking backend (a side effect, by
design: verl's plugin paths only import modules). verl imports it through its
``verl.plugins`` entry point (declared in pyproject.toml) or through
``VERL_USE_EXTERNAL_MODULES=producers.hooks.verl_plugin``; see
:mod:`producers.hooks.verl_tracking`."""

from __future__ import annotations

from producers.hooks.verl_tracking import register

register()
