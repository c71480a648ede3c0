"""The one error shape of every non-200 answer, the 200 answer, and the request types every route shares.

`{"error": {"message", "type", "code"}}` (OpenAI's shape) for 4xx and 5xx alike; messages are capped
and quote inputs only as short excerpts, so a megabyte request never gets a megabyte answer.
Token ids are strict integers: JSON `true`, `1.0` or `"1"` are refused, not read as 1.
"""

from __future__ import annotations

import math
import reprlib
from typing import Annotated, Sequence

from pydantic import Field, StrictFloat, StrictInt

MAX_MESSAGE_CHARS = 1000  # an error message never grows with the input (no echo of a megabyte prompt)
MAX_LISTED_ERRORS = 3  # validation errors spelled out in a 422 message; the rest are counted

# Strict types: JSON true/false, 1.0 or "1" are not token ids (pydantic's lax mode would take them as 1, 0,
# 1, 1). fail_fast: a list stops at its first bad element, so a megabyte of bad ids costs one error, not a
# million (collecting and serialising those took ~40 s and a 137 MB answer).
TokenIds = Annotated[list[StrictInt], Field(fail_fast=True)]
UserVector = Annotated[list[StrictFloat], Field(fail_fast=True)]
PROMPT_ONE, PROMPT_MANY = "token-id list", "list of token-id lists"  # the prompt's two shapes; stripped from error paths
TEXT, TEXTS = "text string", "list of text strings"  # /v1/score's text shapes of `query` and `items`; stripped too
SHAPE_TAGS = (PROMPT_ONE, PROMPT_MANY, TEXT, TEXTS)


def cap(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"


def json_answer(content: dict):
    """A 200 answer, serialized once by `json.dumps`. A route that returns the dict itself has FastAPI walk it
    with `jsonable_encoder` first: ~20% of the HTTP thread's time at the small model's saturation (30 beams per
    answer). The routes' contents are plain JSON types and finite (non-finite results are refused as 400s)."""
    from fastapi.responses import JSONResponse

    return JSONResponse(content)


def error_response(status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None):
    """The one error shape of every non-200 answer: {"error": {"message", "type", "code"}} (OpenAI's)."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": cap(message), "type": kind, "code": status}})


def excerpt(value) -> str:
    """A short repr of `value` (at most ~80 characters, whatever its size): lists cut after 4 elements."""
    r = reprlib.Repr()  # Python 3.11: no keyword arguments yet
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxstring, r.maxother, r.maxlong = 2, 4, 4, 4, 24, 24, 24
    return cap(r.repr(value), 80)


def validation_message(errors: Sequence[dict]) -> str:
    """'prompt.0: Input should be a valid integer (got True)' for the first few of pydantic's errors.

    The path is the field (the prompt's shape tag left out, `body` dropped), the input only a short
    excerpt: pydantic's own answer echoes every bad value, megabytes for a megabyte request.
    """
    parts = []
    for e in errors[:MAX_LISTED_ERRORS]:
        loc = [str(x) for x in e.get("loc", ()) if x not in SHAPE_TAGS]
        if loc[:1] == ["body"]:
            loc = loc[1:]
        if e.get("type") == "json_invalid":
            at = f" at character {loc[0]}" if loc else ""
            parts.append(f"body is not valid JSON{at}: {(e.get('ctx') or {}).get('error', e.get('msg'))}")
            continue
        text = f"{'.'.join(loc) or 'body'}: {e.get('msg', 'invalid value')}"
        if "input" in e and e.get("type") != "missing":
            text += f" (got {excerpt(e['input'])})"
        parts.append(text)
    more = len(errors) - len(parts)
    return cap("; ".join(parts) + (f" (and {more} more)" if more > 0 else "") or "invalid request")


# The last guard: engines catch what they can (NaN/inf vectors, dtype range, projector overflow), but a
# result that still holds NaN/inf came from the input (a healthy model on valid input gives finite log-probs);
# JSON cannot carry it either, so it is a 400, never a 500 from the serialiser.
NON_FINITE = ("the engine's {what} for this request are not finite (NaN or inf): the input drives the model beyond "
              "what its dtype can hold, most likely through the user vector's scale; normalize the vector (e.g. to "
              "unit L2 norm) or fold the user in again")


def all_finite(values) -> bool:
    """True when every number in `values` (a float, or nested lists of them) is finite."""
    if isinstance(values, (list, tuple)):
        return all(all_finite(v) for v in values)
    return math.isfinite(values)
