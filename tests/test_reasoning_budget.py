"""`--reasoning-budget`: -1 thinks freely, 0 turns thinking off as llama-server does, N > 0 closes
the first thinking block after N tokens (llama.cpp's reasoning budget sampler): the state machine,
the sampler chain's forced rows, the engine and the server (through the official openai client)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import reference_text

from lamplight.chat import ChatTemplate
from lamplight.cli import _startup_problem, build_parser, server_settings
from lamplight.sampling import SamplingParams, SequenceSampler, sample_batch
from lamplight.sampling.reasoning_budget import BudgetState, ReasoningBudget, ReasoningBudgetSpec, utf8_missing
from lamplight.server.chat_prompt import render_chat_prompt

CHAT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def _template(name: str) -> ChatTemplate:
    return ChatTemplate(reference_text(f"templates/{name}"), bos_token="<|im_start|>", eos_token="<|im_end|>", name=name)


def test_budget_zero_sets_enable_thinking_false_unless_the_request_says():
    qwen3 = _template("Qwen-Qwen3-0.6B.jinja")
    thinking_off = render_chat_prompt({**CHAT, "chat_template_kwargs": {"enable_thinking": False}}, qwen3)
    assert render_chat_prompt(CHAT, qwen3) != thinking_off  # the template does honour the switch
    assert render_chat_prompt(CHAT, qwen3, reasoning_budget=0) == thinking_off
    asked = {**CHAT, "chat_template_kwargs": {"enable_thinking": True}}
    assert render_chat_prompt(asked, qwen3, reasoning_budget=0) == render_chat_prompt(asked, qwen3)


def test_budget_zero_closes_a_thinking_block_the_prompt_opens():
    r1 = _template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    free = render_chat_prompt(CHAT, r1)
    assert free.rstrip().endswith("<think>")
    closed = render_chat_prompt(CHAT, r1, reasoning_budget=0)
    assert closed == free + "</think>"


def test_the_flags_reach_the_server_and_a_budget_below_minus_one_is_refused():
    parse = build_parser().parse_args
    assert server_settings(parse(["serve", "--reasoning-budget", "0"])).reasoning_budget == 0
    assert server_settings(parse(["serve"])).reasoning_budget == -1
    assert server_settings(parse(["serve", "--reasoning-budget", "256"])).reasoning_budget == 256
    assert server_settings(parse(["serve"])).reasoning_budget_message == ""
    settings = server_settings(parse(["serve", "--reasoning-budget-message", " Time to answer."]))
    assert settings.reasoning_budget_message == " Time to answer."
    for ok in ("-1", "0", "256"):
        assert _startup_problem(parse(["serve", "--reasoning-budget", ok])) is None
    assert "must be -1 (unlimited) or a number of tokens >= 0" in _startup_problem(
        parse(["serve", "--reasoning-budget", "-2"]))


# -- the state machine -----------------------------------------------------------------------------

START, END = (10, 11), (20, 21)


def _budget(budget: int, *, opened: bool = False, message: tuple[int, ...] = (), start=START, end=END,
            token_bytes=None) -> ReasoningBudget:
    spec = ReasoningBudgetSpec(budget=budget, start=start, end=end, forced=message + end, opened=opened)
    return ReasoningBudget(spec, token_bytes)


def _feed(machine: ReasoningBudget, tokens) -> None:
    for token in tokens:
        machine.accept(token)


def _force_all(machine: ReasoningBudget) -> list[int]:
    """Accept what the machine forces until it stops forcing; the forced tokens in order."""
    forced = []
    while (token := machine.forced_token()) is not None:
        forced.append(token)
        machine.accept(token)
    return forced


def test_the_start_marker_in_the_generation_starts_the_count():
    machine = _budget(3)
    _feed(machine, [5, 10, 6, 10])  # a lone first token of the marker does not start it
    assert machine.state is BudgetState.IDLE and machine.forced_token() is None
    machine.accept(11)
    assert machine.state is BudgetState.COUNTING
    _feed(machine, [1, 2])
    assert machine.state is BudgetState.COUNTING and machine.forced_token() is None
    machine.accept(3)
    assert machine.state is BudgetState.FORCING
    assert _force_all(machine) == [20, 21]
    assert machine.state is BudgetState.DONE


def test_a_prompt_that_opened_the_thinking_counts_from_the_first_generated_token():
    machine = _budget(2, opened=True)
    assert machine.state is BudgetState.COUNTING
    _feed(machine, [1, 2])
    assert _force_all(machine) == [20, 21]


def test_a_natural_end_before_the_budget_is_used_up_forces_nothing():
    machine = _budget(5, opened=True)
    _feed(machine, [1, 2, 20, 21])
    assert machine.state is BudgetState.DONE
    for token in [3, 4, 5, 6, 7, 8, 10, 11, 1, 2, 3, 4, 5, 6]:
        machine.accept(token)
        assert machine.forced_token() is None


def test_done_passes_through_forever_only_the_first_block_is_limited():
    machine = _budget(1, opened=True)
    machine.accept(1)
    assert _force_all(machine) == [20, 21]
    _feed(machine, [10, 11] + [1] * 10)  # a second thinking block
    assert machine.state is BudgetState.DONE and machine.forced_token() is None


def test_the_message_then_the_end_marker_are_forced_in_order():
    machine = _budget(2, opened=True, message=(30, 31, 32))
    _feed(machine, [1, 2])
    assert _force_all(machine) == [30, 31, 32, 20, 21]
    assert machine.state is BudgetState.DONE


def test_budget_zero_forces_as_soon_as_the_start_marker_is_generated():
    machine = _budget(0)
    machine.accept(10)
    assert machine.forced_token() is None
    machine.accept(11)
    assert machine.state is BudgetState.FORCING
    assert _force_all(machine) == [20, 21]
    assert _budget(0, opened=True).forced_token() == 20  # the prompt opened it: the first step is forced


# "中" is e4 b8 ad in UTF-8: here its bytes come as three tokens.
PIECES = {1: b"a", 2: b"\xe4", 3: b"\xb8", 4: b"\xad", 5: b"b", 20: b"</", 21: b"think>"}


def test_a_budget_used_up_inside_a_multibyte_character_waits_for_its_end():
    machine = _budget(2, opened=True, token_bytes=PIECES.__getitem__)
    _feed(machine, [1, 2])  # the budget ends after the first byte of the character
    assert machine.state is BudgetState.WAITING_UTF8 and machine.forced_token() is None
    machine.accept(3)
    assert machine.state is BudgetState.WAITING_UTF8  # two of three bytes
    machine.accept(4)
    assert machine.state is BudgetState.FORCING
    assert _force_all(machine) == [20, 21]


def test_the_natural_end_while_waiting_for_a_character_ends_the_budget():
    machine = _budget(1, opened=True, token_bytes=PIECES.__getitem__)
    machine.accept(2)
    assert machine.state is BudgetState.WAITING_UTF8
    _feed(machine, [20, 21])
    assert machine.state is BudgetState.DONE and machine.forced_token() is None


def test_utf8_missing_follows_characters_across_pieces():
    assert utf8_missing(0, b"abc") == 0
    assert utf8_missing(0, "é".encode()[:1]) == 1
    assert utf8_missing(1, "é".encode()[1:]) == 0
    assert utf8_missing(0, "😀".encode()[:2]) == 2
    assert utf8_missing(0, b"\xe4a") == 0  # a broken character ends where the next one starts
    assert utf8_missing(0, b"\xb8") == 0  # a stray continuation byte is no character in progress


def test_markers_are_found_at_any_offset():
    machine = _budget(1, start=(7, 7, 8))
    _feed(machine, [7, 7, 7, 8])
    assert machine.state is BudgetState.COUNTING


def test_a_token_other_than_the_forced_one_ends_the_forcing():
    """The request's grammar forbids the forced token: the grammar wins, the budget steps aside."""
    machine = _budget(1, opened=True)
    machine.accept(1)
    assert machine.forced_token() == 20
    machine.accept(5)
    assert machine.state is BudgetState.DONE and machine.forced_token() is None


def test_an_unusable_spec_is_refused():
    with pytest.raises(ValueError, match="reasoning_budget_tokens"):
        ReasoningBudgetSpec(budget=-1, start=START, end=END, forced=END).validate()
    with pytest.raises(ValueError, match="reasoning_budget_tokens"):
        ReasoningBudgetSpec(budget=1, start=START, end=(), forced=()).validate()


# -- the sampler chain's forced rows ----------------------------------------------------------------

def _sampler(**params) -> SequenceSampler:
    return SequenceSampler(SamplingParams(**{"temperature": 1.0, "seed": 5, **params}), n_ctx=64)


def test_a_forced_token_overrides_logit_bias_and_leaves_other_rows_alone():
    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    banned = [(7, -math.inf)]
    free = [sample_batch(logits[row:row + 1], [_sampler(seed=row)]).token_ids[0] for row in range(3)]
    result = sample_batch(logits, [_sampler(seed=0), _sampler(seed=1, logit_bias=banned), _sampler(seed=2)],
                          forced=[None, 7, None])
    assert result.token_ids == [free[0], 7, free[2]]
    post = sample_batch(logits[1:2], [_sampler(seed=1, logit_bias=banned, n_probs=2, post_sampling_probs=True)],
                        forced=[7])
    assert post.token_ids == [7]
    assert post.probs[0].chosen.prob == pytest.approx(1.0)  # after the chain, the forced token is certain


def test_a_grammar_that_forbids_the_forced_token_wins():
    logits = np.zeros((1, 20), dtype=np.float32)
    allowed = np.zeros((1, 20), dtype=bool)
    allowed[0, 3] = True
    assert sample_batch(logits, [_sampler()], allowed_mask=allowed, forced=[9]).token_ids == [3]
    allowed[0, 9] = True
    assert sample_batch(logits, [_sampler()], allowed_mask=allowed, forced=[9]).token_ids == [9]


# -- the engine and the server on a tiny random model -----------------------------------------------

# ChatML whose generation prompt opens the thinking (as DeepSeek R1's and "always thinking" templates do).
OPEN_THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
N = 6  # the server's --reasoning-budget in these tests
SEED = 11


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(loaded model, engine) on the tiny random llama; the engine serves several requests at once."""
    import lamplight
    from lamplight.server.launcher import EngineOptions, build_engine
    from tiny_gguf import write_tiny_llama

    loaded = lamplight.load(str(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_ctx=2048)))
    engine = build_engine(loaded, EngineOptions(n_ctx=2048, n_parallel=4, n_ubatch=64))
    yield loaded, engine
    engine.stop()


def _bans(tokenizer) -> list[list]:
    """logit_bias (llama.cpp's array form) that leaves the model printable ASCII without `<`: it
    can never write the end marker itself (so it would think forever) and its text has no
    partial characters."""
    def free(token: int) -> bool:
        data = tokenizer.token_bytes(token)
        return bool(data) and all(32 <= byte < 127 for byte in data) and b"<" not in data
    return [[token, False] for token in range(tokenizer.vocab_size) if not free(token)]


def _engine_run(engine, request):
    from lamplight.engine.types import FinalEvent

    events = list(engine.submit(request).iter_events(timeout=120))
    (final,) = [e for e in events if isinstance(e, FinalEvent)]
    return final


def _thinking_request(tokenizer, prompt: str, spec, n_predict: int, seed: int = SEED):
    from lamplight.engine.types import GenerationRequest

    bans = [(token, -math.inf) for token, _ in _bans(tokenizer)]
    sampling = SamplingParams(temperature=1.0, seed=seed, logit_bias=bans, ignore_eos=True)
    ids = tokenizer.encode(prompt, add_special=True, parse_special=True)
    return GenerationRequest(ids, sampling, n_predict=n_predict, reasoning_budget=spec, cache_prompt=False)


def test_the_engine_forces_the_end_after_n_tokens_whatever_else_is_in_the_batch(tiny):
    loaded, engine = tiny
    tok = loaded.tokenizer
    end = tuple(tok.encode("</think>", add_special=False, parse_special=True))
    message = tuple(tok.encode(" Enough.", add_special=False, parse_special=True))
    assert len(end) > 1  # bytes on this vocabulary: the forcing runs over several steps
    spec = ReasoningBudgetSpec(budget=N, start=tuple(tok.encode("<think>", add_special=False)), end=end,
                               forced=message + end, opened=True)
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n"
    n_predict = N + len(message + end) + 5
    alone = _engine_run(engine, _thinking_request(tok, prompt, spec, n_predict))
    free = _engine_run(engine, _thinking_request(tok, prompt, None, n_predict))
    assert alone.token_ids[:N] == free.token_ids[:N]  # nothing changes before the budget is spent
    assert alone.token_ids[N:N + len(message + end)] == message + end  # over a -inf bias on "<"
    assert len(alone.token_ids) == n_predict  # the forced tokens count toward n_predict
    assert alone.content.startswith(tok.decode(list(free.token_ids[:N])) + " Enough.</think>")

    # The same request among others (with budgets of their own, forcing at other steps).
    others = [engine.submit(_thinking_request(tok, prompt, ReasoningBudgetSpec(budget=b, start=spec.start, end=end,
                                                                               forced=end, opened=True),
                                              n_predict, seed=100 + b))
              for b in (1, 3, 9)]
    busy = _engine_run(engine, _thinking_request(tok, prompt, spec, n_predict))
    for handle in others:
        list(handle.iter_events(timeout=120))
    assert busy.token_ids == alone.token_ids


def test_the_engine_starts_counting_at_a_start_marker_it_generates(tiny):
    loaded, engine = tiny
    tok = loaded.tokenizer
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    free = _engine_run(engine, _thinking_request(tok, prompt, None, 12))
    end = tuple(tok.encode("</think>", add_special=False, parse_special=True))
    # The model's own first token plays the start marker.
    spec = ReasoningBudgetSpec(budget=3, start=(free.token_ids[0],), end=end, forced=end, opened=False)
    budgeted = _engine_run(engine, _thinking_request(tok, prompt, spec, 12))
    assert budgeted.token_ids[:4] == free.token_ids[:4]
    assert budgeted.token_ids[4:4 + len(end)] == end


@pytest.fixture(scope="module")
def served(tiny):
    import copy

    import openai
    from test_server_support import ServerThread

    from lamplight.server import ServerSettings, ServerState

    loaded, engine = tiny
    model = copy.copy(loaded)
    model.chat_template = ChatTemplate(OPEN_THINKING_TEMPLATE)
    state = ServerState(ServerSettings(reasoning_budget=N))
    state.attach(model, engine)
    server = ServerThread(state).start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    yield server, client, _bans(loaded.tokenizer)
    server.stop()


def _ask(served, stream: bool = False, **body):
    _, client, bans = served
    extra = {"logit_bias": bans, "ignore_eos": True, **body.pop("extra", {})}
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], temperature=1.0, seed=SEED,
        stream=stream, extra_body=extra, **body)


def _thinking_text(served, n: int) -> str:
    """The first n tokens of the reply as the model writes them with no budget (the prompt opened
    the thinking, so that is all thinking)."""
    raw = _ask(served, max_tokens=n, extra={"reasoning_budget_tokens": -1, "reasoning_format": "none"})
    assert raw.usage.completion_tokens == n
    return raw.choices[0].message.content


def _reasoning(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def test_reasoning_content_holds_n_tokens_then_the_answer_follows(served):
    thinking = _thinking_text(served, N)
    max_tokens = N + 12
    reply = _ask(served, max_tokens=max_tokens)
    message = reply.choices[0].message
    assert _reasoning(message) == thinking.strip()
    assert reply.usage.completion_tokens == max_tokens  # the forced end marker counts as output
    raw = _ask(served, max_tokens=max_tokens, extra={"reasoning_format": "none"}).choices[0].message.content
    assert raw.startswith(thinking + "</think>")
    assert message.content == raw[len(thinking + "</think>"):].lstrip()
    assert message.content  # the model answers after the forced end

    reasoning, content = "", ""
    for chunk in _ask(served, stream=True, max_tokens=max_tokens):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (reasoning.strip(), content) == (_reasoning(message), message.content)


def test_a_request_overrides_the_budget_and_the_message(served):
    thinking = _thinking_text(served, 3)
    extra = {"reasoning_budget_tokens": 3, "reasoning_budget_message": " Enough.", "reasoning_format": "none"}
    raw = _ask(served, max_tokens=20, extra=extra).choices[0].message.content
    assert raw.startswith(thinking + " Enough.</think>")
    split = _ask(served, max_tokens=20, extra={**extra, "reasoning_format": "auto"}).choices[0].message
    assert _reasoning(split) == (thinking + " Enough.").strip()
    assert split.content == raw[len(thinking + " Enough.</think>"):].lstrip()

    unlimited = _ask(served, max_tokens=20, extra={"reasoning_budget_tokens": -1}).choices[0].message
    assert not unlimited.content  # thinks until max_tokens: the model cannot write "<" itself
    assert _reasoning(unlimited)

    off = _ask(served, max_tokens=8, extra={"reasoning_budget_tokens": 0}).choices[0].message
    assert not _reasoning(off) and off.content  # 0: the prompt's thinking block is closed


def test_the_forced_end_passes_an_answer_grammar_and_a_grammar_on_the_whole_reply_wins(served):
    import json

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    thinking = _thinking_text(served, 3)
    reply = _ask(served, max_tokens=60, response_format=response_format, extra={"reasoning_budget_tokens": 3})
    message = reply.choices[0].message  # the grammar is on the answer: the thinking is forced closed
    assert _reasoning(message) == thinking.strip()
    assert isinstance(json.loads(message.content)["a"], int)
    whole = _ask(served, max_tokens=60, response_format=response_format,
                 extra={"reasoning_budget_tokens": 3, "reasoning_format": "none"}).choices[0].message
    assert isinstance(json.loads(whole.content)["a"], int)  # the grammar on the whole reply forbids "</think>"


@pytest.mark.parametrize("value", ["8", 1.5, -2, True, [4]])
def test_a_bad_budget_is_a_400_naming_the_field(served, value):
    import httpx
    from test_server_support import assert_error

    server = served[0]
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "reasoning_budget_tokens": value}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert_error(response, 400, "invalid_request_error", "reasoning_budget_tokens")
    bad_message = {**body, "reasoning_budget_tokens": 2, "reasoning_budget_message": 5}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=bad_message, timeout=60)
    assert_error(response, 400, "invalid_request_error", "reasoning_budget_message")


def test_the_spec_follows_the_template_and_the_prompt(tiny):
    from lamplight.server.chat_prompt import reasoning_budget_spec

    tok = tiny[0].tokenizer
    template = ChatTemplate(OPEN_THINKING_TEMPLATE)
    prompt = render_chat_prompt(CHAT, template)
    spec = reasoning_budget_spec(template, prompt, 4, " Enough.", tok)
    encode = lambda text: tuple(tok.encode(text, add_special=False, parse_special=True))  # noqa: E731
    assert spec == ReasoningBudgetSpec(budget=4, start=encode("<think>"), end=encode("</think>"),
                                       forced=encode(" Enough.") + encode("</think>"), opened=True)
    closed = render_chat_prompt(CHAT, template, reasoning_budget=0)
    assert not reasoning_budget_spec(template, closed, 0, "", tok).opened
    assert reasoning_budget_spec(template, prompt, -1, "", tok) is None
    assert reasoning_budget_spec(ChatTemplate("{{ messages[0].content }}"), prompt, 4, "", tok) is None


def test_apply_template_renders_the_prompt_a_chat_request_would_get(served):
    import httpx

    server, _, _ = served
    url = f"{server.url}/apply-template"
    messages = [{"role": "user", "content": "hello"}]
    budgeted = httpx.post(url, json={"messages": messages}, timeout=60).json()["prompt"]
    assert budgeted.endswith("<think>\n")  # a budget of N > 0 leaves the thinking open
    off = httpx.post(url, json={"messages": messages, "reasoning_budget_tokens": 0}, timeout=60).json()["prompt"]
    assert off.startswith(budgeted) and off != budgeted  # 0: the open block is closed
    bad = httpx.post(url, json={"messages": messages, "reasoning_budget_tokens": -2}, timeout=60)
    assert bad.status_code == 400 and "reasoning_budget_tokens" in bad.json()["error"]["message"]
