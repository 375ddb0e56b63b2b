"""Row formats, one a module, each registered in the format table (`table.py`) when imported here.

`conversation.py` holds the types every format returns (Turn, Conversation, MalformedRow) and the
turn policy; `fields.py`, `tools.py` and `chat.py` what several formats read the same way (fields
and roles, structured tools, chat turns). Adding a format: one module that calls `register`, and
its name below (docs/mix.md, "Formats").
"""

from curator.rows.formats import (
    alpaca,
    bfcl,
    deepswe,
    glaive,
    humaneval,
    ifbench,
    messages,
    mtbench,
    openthoughts,
    pairs,
    sharegpt,
    swe_agent,
    tap,
    tooltalk,
    traffic,
    xlam,
)

__all__ = ["alpaca", "bfcl", "deepswe", "glaive", "humaneval", "ifbench", "messages", "mtbench", "openthoughts",
           "pairs", "sharegpt", "swe_agent", "tap", "tooltalk", "traffic", "xlam"]
