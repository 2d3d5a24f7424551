"""Text from tenant code made safe to carry: bounded, valid UTF-8, no invisible controls.

A pure module (standard library only). Whatever tenant code says — an exception message,
a traceback, a string it returned — is tenant-controlled and reaches events, logs and
terminals. :func:`clean_text` is applied where the host turns a worker's reply into an
attempt record or an outcome (``sandbox.client``) and by the CLI's terminal, so that:

- it is valid UTF-8: lone surrogates (``"\\ud800"``, which JSON can carry as an escape
  and Python then holds in a ``str``) become U+FFFD, so no event fails to serialise;
- nothing in it acts on a terminal or reorders text: C0 controls (but ``\\n`` and ``\\t``,
  and those too with ``oneline=True``), DEL, C1 controls (``\\x9b`` is a one-byte CSI),
  the bidi embeddings, overrides, isolates and marks (U+202A-U+202E, U+2066-U+2069,
  U+200E, U+200F, U+061C) and the line/paragraph separators U+2028/U+2029 are written
  as visible escapes (``\\x1b``, ``\\u202e``), never passed through;
- it is bounded: at most ``limit`` characters; a longer text keeps its head and its tail
  (where a traceback names the exception) around a marker saying how much was cut.

``clean_text`` is idempotent: cleaning a cleaned text changes nothing.
"""

from __future__ import annotations

import re

#: Default bound of a message carried in an event (RewardBatchFailed.message).
MESSAGE_LIMIT = 2000
#: Default bound of one example (an offending input or output) carried in an event.
EXAMPLE_LIMIT = 300

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")
_UNSAFE_ONELINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, *, oneline: bool = False) -> str:
    """``text`` with lone surrogates replaced and every control/bidi character escaped
    visibly (``\\n``/``\\t`` kept unless ``oneline``). Unbounded; see :func:`clean_text`."""
    pattern = _UNSAFE_ONELINE if oneline else _UNSAFE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def clean_text(value: object, limit: int = MESSAGE_LIMIT, *, oneline: bool = False) -> str:
    """``value`` as safe, bounded text (see the module docstring). Never raises."""
    if not isinstance(value, str):
        try:
            value = str(value)
        except Exception:
            value = f"<unprintable {type(value).__name__}>"
    limit = max(limit, 2 * len(_MARKER.format(0)))
    if len(value) <= limit:
        text = escape_controls(value, oneline=oneline)
        if len(text) <= limit:
            return text
    # too long: the head and the tail of the raw text whose escaped forms fit the budget
    budget = limit - len(_MARKER.format(len(value)))
    head_budget = budget // 4
    i = used = 0
    while i < len(value):
        w = len(escape_controls(value[i], oneline=oneline))
        if used + w > head_budget:
            break
        used += w
        i += 1
    j, used, tail_budget = len(value), 0, budget - used
    while j > i:
        w = len(escape_controls(value[j - 1], oneline=oneline))
        if used + w > tail_budget:
            break
        used += w
        j -= 1
    head = escape_controls(value[:i], oneline=oneline)
    tail = escape_controls(value[j:], oneline=oneline)
    return head + _MARKER.format(j - i) + tail


_MARKER = " … [{} characters cut] … "
