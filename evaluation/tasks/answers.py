"""The light, exact normalization applied to a generated text before a metric reads it.

Only these are removed, nothing else is repaired:
* surrounding whitespace;
* trailing end-of-turn markers of the supported chat models' templates, written out as text
  (`END_OF_TURN_MARKERS`), and the whitespace before them;
* for code answers (JSON, SQL) only: one markdown code fence around the whole answer,
  "```lang\\n ... \\n```" (any language tag or none), keeping its body.
"""

from __future__ import annotations

import re

END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")
CODE_FENCE = re.compile(r"```[\w+-]*[ \t]*\n(?P<body>.*?)\n?```", re.DOTALL)


def strip_answer(text: str) -> str:
    """`text` without surrounding whitespace and without trailing end-of-turn markers."""
    answer = text.strip()
    while marker := next((m for m in END_OF_TURN_MARKERS if answer.endswith(m)), None):
        answer = answer[: -len(marker)].rstrip()
    return answer


def unwrap_code_fence(text: str) -> str:
    """The stripped body of `text` when all of it is one markdown code block, else `text`."""
    match = CODE_FENCE.fullmatch(text)
    return match["body"].strip() if match else text
