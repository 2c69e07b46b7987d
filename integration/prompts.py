"""The fuzz's prompts under prefix caching: token ids that share prefixes the way served
traffic does, drawn with Hypothesis (docs/design.md §6).

A prompt is one of ``PROMPT_KINDS``:

- ``fresh``: ids of its own (it can still hit its own blocks, resuming after a preemption);
- ``system``: a system prompt the example's requests share, then ids of its own;
- ``document``: a long shared document (half the prompt or more), then a question;
- ``repeat``: an earlier request's prompt, exactly;
- ``turn``: an earlier request's prompt, a run of its output (``token_ids.output_token_id``:
  a prefix of what that request sampled, however far it got), then a new message.

Half the prompts are then cut to a full-hit length, ``n * block_size + 1``: a prompt whose
first ``n`` blocks are cached is admitted with all but its last token computed (vLLM caps
a hit at ``num_tokens - 1``), a one-token request that joins the decodes padded to 1 + K.
The ids of every prompt are explicit (``RequestSpec.prompt_token_ids``), so a divergence's
scenario file carries them.
"""

from __future__ import annotations

from collections.abc import Sequence

import hypothesis.strategies as st

from dualbudget.reference.formats.scenario import RequestSpec
from dualbudget.reference.token_ids import output_token_id, segment, unique_prompt
from dualbudget.spec.config import EngineConfig

PROMPT_KINDS = ("fresh", "system", "document", "repeat", "turn")
"""The kinds of prompt; the last two need an earlier request."""


def prompt_ids_of(request: RequestSpec) -> tuple[int, ...]:
    """The ids ``request``'s prompt is given (the driver's own when it has none)."""
    if request.prompt_token_ids is not None:
        return request.prompt_token_ids
    return unique_prompt(request.id, request.prompt_len)


def draw_prompt_ids(
    data: st.DataObject,
    config: EngineConfig,
    earlier: Sequence[RequestSpec],
    prompt_len: int,
) -> tuple[int, ...]:
    """The ids of the next request's prompt: ``prompt_len`` of them for the kinds that
    make a prompt of their own, an earlier request's length (and more) for the others;
    never ``max_model_len`` or more (vLLM refuses those)."""
    limit = config.max_model_len - 1
    kinds = PROMPT_KINDS if earlier else PROMPT_KINDS[:3]
    kind = data.draw(st.sampled_from(kinds), label="prompt kind")
    own = segment(f"own:{len(earlier)}", limit)
    ids: tuple[int, ...]
    if kind == "fresh":
        ids = own[:prompt_len]
    elif kind == "system":
        shared = data.draw(st.integers(1, prompt_len), label="system prompt tokens")
        ids = segment("system", shared) + own[: prompt_len - shared]
    elif kind == "document":
        document = data.draw(st.integers(0, 1), label="document")
        shared = data.draw(st.integers(max(1, prompt_len // 2), prompt_len), label="shared tokens")
        ids = segment(f"document:{document}", shared) + own[: prompt_len - shared]
    else:
        before = data.draw(st.sampled_from(earlier), label="earlier request")
        ids = prompt_ids_of(before)
        if kind == "turn":
            reply = data.draw(st.integers(0, before.max_tokens), label="turn output tokens")
            more = data.draw(st.integers(1, 8), label="turn new tokens")
            ids = (ids + (output_token_id(before.id),) * reply + own[:more])[:limit]
    block_size = config.block_size
    if len(ids) > block_size and data.draw(st.booleans(), label="full-hit length"):
        ids = ids[: (len(ids) - 1) // block_size * block_size + 1]
    return ids
