"""Token ids for prefix caching: the ids a run gives every prompt and every sampled token
when ``enable_prefix_caching`` is on (docs/design.md §6).

The budgets never read token ids; only the prefix cache does, through the hashes chained
over them. The reference and vLLM see the very same ids: the driver makes them
(``reference.runs.driver``), the live adapter passes them on. Every id here is in
``[FIRST_ID, VOCAB_SIZE)``, clear of the special ids (the live model's eos is 2) and of
``STOP_TOKEN_ID``, so that no prompt or sampled id stops a request by accident.

- A request samples one id, ``output_token_id(request_id)``, at every position but a
  natural stop, which samples ``STOP_TOKEN_ID``: whatever a request sampled so far, its
  prompt followed by any run of its output id is a prefix of its own tokens, so a later
  turn (an earlier prompt, its output, more) is built without knowing how far it got.
- A prompt given no ids of its own gets ``unique_prompt``: ids drawn from the request id,
  shared with no other request.
- ``segment(label, n)``: ``n`` ids fixed by ``label``, the building block of prompts that
  share prefixes (a system prompt, a document).
"""

from __future__ import annotations

import zlib

STOP_TOKEN_ID = 14
"""Every request's stop token (``SamplingParams.stop_token_ids``): a natural stop samples it."""
FIRST_ID = 20
VOCAB_SIZE = 1000
"""The live model's ``vocab_size``: every id is below it."""
_SPAN = VOCAB_SIZE - FIRST_ID


def _id(text: str) -> int:
    return FIRST_ID + zlib.crc32(text.encode()) % _SPAN


def segment(label: str, n: int) -> tuple[int, ...]:
    """``n`` ids fixed by ``label`` (the same label, the same ids, in every process)."""
    return tuple(_id(f"{label}/{i}") for i in range(n))


def unique_prompt(request_id: str, n: int) -> tuple[int, ...]:
    """The ids of a prompt of ``n`` tokens that shares nothing with another request's."""
    return segment(f"prompt:{request_id}", n)


def output_token_id(request_id: str) -> int:
    """The id ``request_id`` samples at every position that is not a natural stop."""
    return _id(f"output:{request_id}")


def sampled_token_ids(request_id: str, num_sampled: int, stopped: int = 0) -> tuple[int, ...]:
    """The ids of ``num_sampled`` tokens sampled in one step, the ``stopped``-th (from 1;
    0: none) the stop token (``ModelOutput.token_ids``)."""
    ids = [output_token_id(request_id)] * num_sampled
    if 0 < stopped <= num_sampled:
        ids[stopped - 1] = STOP_TOKEN_ID
    return tuple(ids)
