"""llama-server's command line and LLAMA_ARG_* variables, accepted as they are (issue 26): every
flag of llama-server's README parses, each with llama.cpp's environment variable; a recorded
docker/compose command line starts lamplight on a tiny model; refusals are one line naming the
flag; --api-prefix, a UNIX socket, --api-key-file and HTTPS work."""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from conftest import REPO_ROOT, reference_text
from test_server_cli import free_port, wait_for_status
from tiny_gguf import write_tiny_llama

from lamplight.cli import build_parser, engine_options, main, server_settings
from lamplight.serve_flags import (ACCEPTED, IMPLEMENTED, REFUSED, accepted_notes, all_flags, flags_markdown,
                                   settings_from, status_counts)
from lamplight.server import ServerSettings, ServerState
from lamplight.server.launcher import serve, uvicorn_server
from lamplight.server.params import Endpoint, parse_generation_params

# Every flag spelling in llama-server's README (tools/server/README.md, llama.cpp commit 00dc8057,
# the common, sampling and server sections), then older spellings compose files still use.
LLAMA_SERVER_FLAGS = """
-h --help --usage --version -cl --cache-list --completion-bash -t --threads -tb --threads-batch -C --cpu-mask
-Cr --cpu-range --cpu-strict --prio --poll -Cb --cpu-mask-batch -Crb --cpu-range-batch --cpu-strict-batch
--prio-batch --poll-batch -c --ctx-size -n --predict --n-predict -b --batch-size -ub --ubatch-size --keep
--swa-full -fa --flash-attn --perf --no-perf -e --escape --no-escape --rope-scaling --rope-scale
--rope-freq-base --rope-freq-scale --yarn-orig-ctx --yarn-ext-factor --yarn-attn-factor --yarn-beta-slow
--yarn-beta-fast -kvo --kv-offload -nkvo --no-kv-offload --repack -nr --no-repack --no-host -ctk
--cache-type-k -ctv --cache-type-v -dt --defrag-thold --rpc -lm --load-mode -lzm --lazy-mode --numa -dev
--device --list-devices -ot --override-tensor -cmoe --cpu-moe -ncmoe --n-cpu-moe --moe-cache-mib -ncffn
--n-cpu-ffn -ngl --gpu-layers --n-gpu-layers -sm --split-mode -ts --tensor-split -mg --main-gpu -fit --fit
-fitt --fit-target -fitc --fit-ctx --check-tensors --override-kv --op-offload --no-op-offload --lora
--lora-scaled --control-vector --control-vector-scaled --control-vector-layer-range -m --model -mu
--model-url -dr --docker-repo -hf -hfr --hf-repo -hff --hf-file -hft --hf-token --log-disable --log-file
--log-jsonl --no-log-jsonl --log-colors -v --verbose --log-verbose --offline -lv --verbosity
--log-verbosity --log-prefix --no-log-prefix --log-timestamps --no-log-timestamps --spec-draft-type-k
-ctkd --cache-type-k-draft --spec-draft-type-v -ctvd --cache-type-v-draft
--samplers -s --seed --sampler-seq --sampling-seq --ignore-eos --temp --temperature --top-k --top-p --min-p
--top-nsigma --top-n-sigma --xtc-probability --xtc-threshold --typical --typical-p --repeat-last-n
--repeat-penalty --presence-penalty --frequency-penalty --dry-multiplier --dry-base --dry-allowed-length
--dry-penalty-last-n --dry-sequence-breaker --adaptive-target --adaptive-decay --dynatemp-range
--dynatemp-exp --mirostat --mirostat-lr --mirostat-ent -l --logit-bias --grammar --grammar-file -j
--json-schema -jf --json-schema-file -bs --backend-sampling
-lcs --lookup-cache-static -lcd --lookup-cache-dynamic --kv-unified-per-slot -ctxcp --ctx-checkpoints
--swa-checkpoints -cms --checkpoint-min-step -cram --cache-ram -kvu --kv-unified -no-kvu --no-kv-unified
--cache-idle-slots --no-cache-idle-slots --context-shift --no-context-shift -r --reverse-prompt -sp
--special --warmup --no-warmup --spm-infill --pooling -np --parallel -cb --cont-batching -nocb
--no-cont-batching -mm --mmproj -mmu --mmproj-url --mmproj-auto --no-mmproj --no-mmproj-auto
--mmproj-offload --no-mmproj-offload -mmdev --mmproj-device --image-min-tokens --image-max-tokens
--mtmd-batch-max-tokens --video-fps --video-timestamp-interval --video-ffmpeg-dir -a --alias --tags
--embd-normalize --host --port --reuse-port --path --cors-origins --cors-methods --cors-headers
--cors-credentials --no-cors-credentials --api-prefix --ui-config --webui-config --ui-config-file
--webui-config-file --ui-mcp-proxy --webui-mcp-proxy --no-ui-mcp-proxy --no-webui-mcp-proxy --tools
--tools-runtime --mcp-servers-config --mcp-servers-json -ag --agent -no-ag --no-agent --ui --webui --no-ui
--no-webui --embedding --embeddings --rerank --reranking --api-key --api-key-file --ssl-key-file
--ssl-cert-file --chat-template-kwargs -to --timeout --sse-ping-interval --threads-http --cache-prompt
--no-cache-prompt --cache-reuse --metrics --props --slots --no-slots --slot-save-path --media-path
--models-dir --models-preset --models-max --models-autoload --no-models-autoload --jinja --no-jinja
--reasoning-format -rea --reasoning --reasoning-effort --reasoning-budget --reasoning-budget-message
--reasoning-preserve --no-reasoning-preserve --chat-template --chat-template-file --skip-chat-parsing
--no-skip-chat-parsing --prefill-assistant --no-prefill-assistant -sps --slot-prompt-similarity
--lora-init-without-apply --sleep-idle-seconds --log-prompts-dir --spec-draft-hf -hfd -hfrd --hf-repo-draft
--spec-draft-threads -td --threads-draft --spec-draft-threads-batch -tbd --threads-batch-draft
--spec-draft-cpu-mask -Cd --cpu-mask-draft --spec-draft-cpu-range -Crd --cpu-range-draft
--spec-draft-cpu-strict --cpu-strict-draft --spec-draft-prio --prio-draft --spec-draft-poll --poll-draft
--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft --spec-draft-cpu-strict-batch
--cpu-strict-batch-draft --spec-draft-prio-batch --prio-batch-draft --spec-draft-poll-batch
--poll-batch-draft --spec-draft-override-tensor -otd --override-tensor-draft --spec-draft-cpu-moe -cmoed
--cpu-moe-draft --spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft --spec-draft-n-max
--spec-draft-n-min --spec-synth-len --spec-synth-rates --spec-draft-p-split --draft-p-split
--spec-draft-p-min --draft-p-min --spec-draft-backend-sampling --no-spec-draft-backend-sampling
--spec-draft-sampling --spec-draft-device -devd --device-draft --spec-draft-ngl -ngld --gpu-layers-draft
--n-gpu-layers-draft --spec-draft-model -md --model-draft --spec-type --spec-ngram-mod-n-min
--spec-ngram-mod-n-max --spec-ngram-mod-n-match --spec-ngram-simple-size-n --spec-ngram-simple-size-m
--spec-ngram-simple-min-hits --spec-ngram-map-k-size-n --spec-ngram-map-k-size-m --spec-ngram-map-k-min-hits
--spec-ngram-map-k4v-size-n --spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-min-hits --draft --draft-n
--draft-max --draft-min --draft-n-min --spec-ngram-size-n --spec-ngram-size-m --spec-ngram-min-hits
--embd-gemma-default --fim-qwen-1.5b-default --fim-qwen-3b-default --fim-qwen-7b-default --fim-qwen-7b-spec
--fim-qwen-14b-spec --fim-qwen-30b-default --gpt-oss-20b-default --gpt-oss-120b-default
--vision-gemma-4b-default --vision-gemma-12b-default --spec-default
--mlock --mmap --no-mmap -dio --direct-io
""".split()

# The README's "(env: ...)" of each flag (the same commit): llama.cpp's set_env names.
LLAMA_SERVER_ENV = {
    "--threads": "LLAMA_ARG_THREADS", "--ctx-size": "LLAMA_ARG_CTX_SIZE", "--n-predict": "LLAMA_ARG_N_PREDICT",
    "--batch-size": "LLAMA_ARG_BATCH", "--ubatch-size": "LLAMA_ARG_UBATCH", "--swa-full": "LLAMA_ARG_SWA_FULL",
    "--flash-attn": "LLAMA_ARG_FLASH_ATTN", "--perf": "LLAMA_ARG_PERF", "--rope-scaling": "LLAMA_ARG_ROPE_SCALING_TYPE",
    "--rope-scale": "LLAMA_ARG_ROPE_SCALE", "--rope-freq-base": "LLAMA_ARG_ROPE_FREQ_BASE",
    "--rope-freq-scale": "LLAMA_ARG_ROPE_FREQ_SCALE", "--yarn-orig-ctx": "LLAMA_ARG_YARN_ORIG_CTX",
    "--kv-offload": "LLAMA_ARG_KV_OFFLOAD", "--repack": "LLAMA_ARG_REPACK", "--no-host": "LLAMA_ARG_NO_HOST",
    "--cache-type-k": "LLAMA_ARG_CACHE_TYPE_K", "--cache-type-v": "LLAMA_ARG_CACHE_TYPE_V",
    "--defrag-thold": "LLAMA_ARG_DEFRAG_THOLD", "--rpc": "LLAMA_ARG_RPC", "--load-mode": "LLAMA_ARG_LOAD_MODE",
    "--lazy-mode": "LLAMA_ARG_LAZY_MODE", "--numa": "LLAMA_ARG_NUMA", "--device": "LLAMA_ARG_DEVICE",
    "--override-tensor": "LLAMA_ARG_OVERRIDE_TENSOR", "--cpu-moe": "LLAMA_ARG_CPU_MOE",
    "--n-cpu-moe": "LLAMA_ARG_N_CPU_MOE", "--moe-cache-mib": "LLAMA_ARG_MOE_CACHE_MIB",
    "--n-cpu-ffn": "LLAMA_ARG_N_CPU_FFN", "--n-gpu-layers": "LLAMA_ARG_N_GPU_LAYERS",
    "--split-mode": "LLAMA_ARG_SPLIT_MODE", "--tensor-split": "LLAMA_ARG_TENSOR_SPLIT",
    "--main-gpu": "LLAMA_ARG_MAIN_GPU", "--fit": "LLAMA_ARG_FIT", "--fit-target": "LLAMA_ARG_FIT_TARGET",
    "--fit-ctx": "LLAMA_ARG_FIT_CTX", "--model": "LLAMA_ARG_MODEL", "--model-url": "LLAMA_ARG_MODEL_URL",
    "--docker-repo": "LLAMA_ARG_DOCKER_REPO", "--hf-repo": "LLAMA_ARG_HF_REPO", "--hf-file": "LLAMA_ARG_HF_FILE",
    "--hf-token": "HF_TOKEN", "--log-file": "LLAMA_ARG_LOG_FILE", "--log-jsonl": "LLAMA_ARG_LOG_JSONL",
    "--log-colors": "LLAMA_ARG_LOG_COLORS", "--offline": "LLAMA_ARG_OFFLINE",
    "--log-verbosity": "LLAMA_ARG_LOG_VERBOSITY", "--log-prefix": "LLAMA_ARG_LOG_PREFIX",
    "--log-timestamps": "LLAMA_ARG_LOG_TIMESTAMPS", "--temp": "LLAMA_ARG_TEMPERATURE", "--top-k": "LLAMA_ARG_TOP_K",
    "--top-p": "LLAMA_ARG_TOP_P", "--min-p": "LLAMA_ARG_MIN_P", "--repeat-penalty": "LLAMA_ARG_REPEAT_PENALTY",
    "--presence-penalty": "LLAMA_ARG_PRESENCE_PENALTY", "--frequency-penalty": "LLAMA_ARG_FREQUENCY_PENALTY",
    "--backend-sampling": "LLAMA_ARG_BACKEND_SAMPLING", "--kv-unified-per-slot": "LLAMA_ARG_KV_UNIFIED_PER_SLOT",
    "--ctx-checkpoints": "LLAMA_ARG_CTX_CHECKPOINTS", "--checkpoint-min-step": "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
    "--cache-ram": "LLAMA_ARG_CACHE_RAM", "--kv-unified": "LLAMA_ARG_KV_UNIFIED",
    "--cache-idle-slots": "LLAMA_ARG_CACHE_IDLE_SLOTS", "--context-shift": "LLAMA_ARG_CONTEXT_SHIFT",
    "--pooling": "LLAMA_ARG_POOLING", "--parallel": "LLAMA_ARG_N_PARALLEL",
    "--cont-batching": "LLAMA_ARG_CONT_BATCHING",
    "--mmproj": "LLAMA_ARG_MMPROJ", "--mmproj-url": "LLAMA_ARG_MMPROJ_URL", "--mmproj-auto": "LLAMA_ARG_MMPROJ_AUTO",
    "--mmproj-offload": "LLAMA_ARG_MMPROJ_OFFLOAD", "--mmproj-device": "MTMD_BACKEND_DEVICE",
    "--image-min-tokens": "LLAMA_ARG_IMAGE_MIN_TOKENS", "--image-max-tokens": "LLAMA_ARG_IMAGE_MAX_TOKENS",
    "--alias": "LLAMA_ARG_ALIAS", "--tags": "LLAMA_ARG_TAGS", "--host": "LLAMA_ARG_HOST", "--port": "LLAMA_ARG_PORT",
    "--reuse-port": "LLAMA_ARG_REUSE_PORT", "--path": "LLAMA_ARG_STATIC_PATH",
    "--cors-origins": "LLAMA_ARG_CORS_ORIGINS",
    "--cors-methods": "LLAMA_ARG_CORS_METHODS", "--cors-headers": "LLAMA_ARG_CORS_HEADERS",
    "--cors-credentials": "LLAMA_ARG_CORS_CREDENTIALS", "--api-prefix": "LLAMA_ARG_API_PREFIX",
    "--ui-config": "LLAMA_ARG_UI_CONFIG", "--ui-mcp-proxy": "LLAMA_ARG_UI_MCP_PROXY", "--tools": "LLAMA_ARG_TOOLS",
    "--agent": "LLAMA_ARG_AGENT", "--ui": "LLAMA_ARG_UI", "--embedding": "LLAMA_ARG_EMBEDDINGS",
    "--rerank": "LLAMA_ARG_RERANKING", "--api-key": "LLAMA_API_KEY", "--api-key-file": "LLAMA_ARG_API_KEY_FILE",
    "--ssl-key-file": "LLAMA_ARG_SSL_KEY_FILE", "--ssl-cert-file": "LLAMA_ARG_SSL_CERT_FILE",
    "--chat-template-kwargs": "LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "--timeout": "LLAMA_ARG_TIMEOUT",
    "--sse-ping-interval": "LLAMA_ARG_SSE_PING_INTERVAL", "--threads-http": "LLAMA_ARG_THREADS_HTTP",
    "--cache-prompt": "LLAMA_ARG_CACHE_PROMPT", "--cache-reuse": "LLAMA_ARG_CACHE_REUSE",
    "--metrics": "LLAMA_ARG_ENDPOINT_METRICS", "--props": "LLAMA_ARG_ENDPOINT_PROPS",
    "--slots": "LLAMA_ARG_ENDPOINT_SLOTS", "--slot-save-path": "LLAMA_ARG_SLOT_SAVE_PATH",
    "--models-dir": "LLAMA_ARG_MODELS_DIR", "--models-preset": "LLAMA_ARG_MODELS_PRESET",
    "--models-max": "LLAMA_ARG_MODELS_MAX", "--models-autoload": "LLAMA_ARG_MODELS_AUTOLOAD",
    "--jinja": "LLAMA_ARG_JINJA", "--reasoning-format": "LLAMA_ARG_THINK", "--reasoning": "LLAMA_ARG_REASONING",
    "--reasoning-effort": "LLAMA_ARG_REASONING_EFFORT", "--reasoning-budget": "LLAMA_ARG_THINK_BUDGET",
    "--reasoning-budget-message": "LLAMA_ARG_THINK_BUDGET_MESSAGE",
    "--reasoning-preserve": "LLAMA_ARG_REASONING_PRESERVE", "--chat-template": "LLAMA_ARG_CHAT_TEMPLATE",
    "--chat-template-file": "LLAMA_ARG_CHAT_TEMPLATE_FILE", "--skip-chat-parsing": "LLAMA_ARG_SKIP_CHAT_PARSING",
    "--prefill-assistant": "LLAMA_ARG_PREFILL_ASSISTANT", "--spec-draft-model": "LLAMA_ARG_SPEC_DRAFT_MODEL",
    "--spec-type": "LLAMA_ARG_SPEC_TYPE", "--draft": "LLAMA_ARG_DRAFT_MAX",
}

# A llama-server command line from a docker compose file, as it is (the model path replaced).
RECORDED = ("-m {model} --host 127.0.0.1 --port {port} -c 4096 -ngl 99 -fa on --jinja -np -1 --no-mmap --slots "
            "--metrics -s 7 --temperature 0.7 --no-ui --cache-reuse 256 --log-disable")
RECORDED_ENV = {"LLAMA_ARG_ALIAS": "compose-model", "LLAMA_ARG_N_PREDICT": "3", "LLAMA_ARG_ENDPOINT_PROPS": "1",
                "LLAMA_ARG_CTX_SIZE": "1024", "LLAMA_ARG_N_GPU_LAYERS": "all", "LLAMA_ARG_TOP_K": "5"}


def parse(argv: list[str]):
    return build_parser().parse_args(["serve", *argv])


def by_name() -> dict:
    return {name: flag for flag in all_flags() for name in flag.names}


@pytest.fixture
def clean_env(monkeypatch):
    """No LLAMA_ARG_* of the machine's leaks into a test."""
    for name in list(os.environ):
        if name.startswith(("LLAMA_ARG_", "LLAMA_API_KEY")):
            monkeypatch.delenv(name)
    return monkeypatch


# -- the table ---------------------------------------------------------------------------------

def test_every_llama_server_flag_is_in_the_table():
    missing = [name for name in LLAMA_SERVER_FLAGS if name not in by_name()]
    assert not missing, missing


def test_each_flag_reads_llama_cpps_variable():
    flags = by_name()
    wrong = {name: (flags[name].env, env) for name, env in LLAMA_SERVER_ENV.items() if flags[name].env != env}
    assert not wrong, wrong
    named = [flag.env for flag in all_flags() if flag.env]
    assert len(named) == len(set(named)), "an environment variable read by two flags"


def test_flags_named_in_the_semantics_doc_parse():
    """Every flag the reference's CLI table (section 4.5) names is known to the parser."""
    text = reference_text("llama-server-semantics.md")
    start = text.index("### 4.5")
    section = text[start:text.index("\n---\n", start)]
    named = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", " ".join(re.findall(r"`([^`]*)`", section))))
    named -= {"-1"}
    assert len(named) > 40
    assert sorted(name for name in named if name not in by_name()) == []


def test_counts_and_the_readme_section_are_the_generated_table(capsys):
    counts = status_counts()
    assert set(counts) == {IMPLEMENTED, ACCEPTED, REFUSED} and all(counts.values())
    assert sum(counts.values()) == sum(1 for flag in all_flags() if not flag.own)
    table = flags_markdown()
    assert table.startswith(f"{sum(counts.values())} llama-server flags: {counts[IMPLEMENTED]} implemented, "
                            f"{counts[ACCEPTED]} accepted with a note, {counts[REFUSED]} refused.")
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    begin, end = "<!-- llama-server flags: begin -->\n", "<!-- llama-server flags: end -->"
    assert readme[readme.index(begin) + len(begin):readme.index(end)] == table, \
        "README's table is stale: paste `lamplight flags --markdown` between its markers"
    assert main(["flags", "--markdown"]) == 0
    assert capsys.readouterr().out == table
    for flag in all_flags():
        if not flag.own:
            assert f"| {flag.status} | {(flag.refused or flag.note or flag.help).replace('|', chr(92) + '|')} |" \
                in table, flag.names


# -- the recorded command line -----------------------------------------------------------------

def test_recorded_command_line_parses_into_llama_servers_meaning(clean_env):
    args = parse(RECORDED.format(model="model.gguf", port=8080).split())
    engine, settings = engine_options(args), server_settings(args)
    assert (engine.n_ctx, engine.n_parallel, engine.kv_unified) == (4096, 4, True)  # -np -1: auto, 4 slots, one pool
    assert (settings.host, settings.port, settings.metrics, settings.slots_endpoint, settings.webui) == \
        ("127.0.0.1", 8080, True, True, False)
    assert settings.sampling_defaults == {"seed": 7, "temperature": 0.7}
    assert settings.log_level == "critical" and args.jinja
    assert accepted_notes(args) == [
        "-fa on: lamplight picks its attention kernel itself (its native kernels, else PyTorch's "
        "scaled_dot_product_attention)",
        "-ngl 99: lamplight runs the whole model with torch on one device (the CPU, or torch's CUDA device)",
        "--no-mmap: lamplight memory-maps the GGUF and copies what its kernels repack",
        "--cache-reuse 256: lamplight reuses cached prefixes, not chunks shifted into place: a shifted chunk's K/V "
        "were computed after other tokens, so the reply would depend on what was cached (requests' n_cache_reuse is "
        "accepted and ignored likewise)",
    ]


def test_recorded_command_line_serves_a_tiny_model(tmp_path):
    model = write_tiny_llama(tmp_path / "model.gguf", n_ctx=2048)  # a slot's context is capped by the model's
    port = free_port()
    command = [sys.executable, "-m", "lamplight.cli", "serve", *RECORDED.format(model=model, port=port).split()]
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLAMA_ARG_")}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**env, **RECORDED_ENV, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_status(f"{base}/health", 200)
        meta = httpx.get(f"{base}/v1/models").json()["data"][0]
        # -c wins over its variable; -np auto: one pool, a sequence up to all of it, capped by the model's 2048
        assert meta["id"] == "compose-model" and meta["meta"]["n_ctx"] == 2048
        props = httpx.get(f"{base}/props").json()
        params = props["default_generation_settings"]["params"]
        assert (props["total_slots"], params["seed"], params["top_k"], params["n_predict"]) == (4, 7, 5, 3)
        assert abs(params["temperature"] - 0.7) < 1e-6
        assert httpx.get(f"{base}/slots").status_code == 200 and httpx.get(f"{base}/metrics").status_code == 200
        assert httpx.get(f"{base}/index.html").status_code == 404  # --no-ui (`/` is Ollama's "is running")
        assert httpx.post(f"{base}/props", json={}).json() == {"success": True}  # LLAMA_ARG_ENDPOINT_PROPS=1
        body = httpx.post(f"{base}/completion", json={"prompt": "hi"}, timeout=30).json()
        assert body["tokens_predicted"] == 3 and body["model"] == "compose-model"  # LLAMA_ARG_N_PREDICT
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("lamplight serve did not stop on SIGINT")
    assert process.returncode == 0, err
    assert "lamplight:" not in err  # --log-disable: no start-up lines, no notes


# -- environment variables ---------------------------------------------------------------------

def test_the_command_line_wins_over_the_environment(clean_env):
    clean_env.setenv("LLAMA_ARG_CTX_SIZE", "2048")
    clean_env.setenv("LLAMA_ARG_TEMPERATURE", "0.3")
    clean_env.setenv("LLAMA_ARG_CONTEXT_SHIFT", "enabled")
    assert engine_options(parse(["-c", "1024"])).n_ctx == 1024
    args = parse([])
    assert (engine_options(args).n_ctx, engine_options(args).context_shift) == (2048, True)
    assert server_settings(args).sampling_defaults == {"temperature": 0.3}
    assert engine_options(parse(["--no-context-shift"])).context_shift is False


@pytest.mark.parametrize("text, value", [("1", True), ("true", True), ("on", True), ("enabled", True),
                                         ("0", False), ("false", False), ("off", False), ("disabled", False)])
def test_booleans_read_as_llama_cpp_reads_them(clean_env, text, value):
    clean_env.setenv("LLAMA_ARG_ENDPOINT_METRICS", text)
    clean_env.setenv("LLAMA_ARG_ENDPOINT_SLOTS", text)
    clean_env.setenv("LLAMA_ARG_UI", text)
    settings = server_settings(parse([]))
    assert (settings.metrics, settings.slots_endpoint, settings.webui) == (value, value, value)
    flipped = server_settings(parse(["--no-slots", "--metrics"] if value else ["--slots", "--ui"]))
    assert (flipped.slots_endpoint, flipped.webui if not value else flipped.metrics) == (not value, True)


@pytest.mark.parametrize("name, text, message", [
    ("LLAMA_ARG_ENDPOINT_METRICS", "maybe", "LLAMA_ARG_ENDPOINT_METRICS='maybe': not a boolean"),
    ("LLAMA_ARG_CTX_SIZE", "big", "LLAMA_ARG_CTX_SIZE='big': invalid int value: 'big'"),
    ("LLAMA_ARG_N_PARALLEL", "0", "LLAMA_ARG_N_PARALLEL='0': must be -1 (auto) or a number of slots >= 1, got 0"),
    ("LLAMA_ARG_CACHE_TYPE_K", "q4_k",
     "LLAMA_ARG_CACHE_TYPE_K='q4_k': must be one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"),
    ("LLAMA_ARG_MMPROJ_URL", "http://x/m.gguf", "LLAMA_ARG_MMPROJ_URL=http://x/m.gguf (--mmproj-url): not yet"),
    ("LLAMA_ARG_EMBEDDINGS", "maybe", "LLAMA_ARG_EMBEDDINGS='maybe': not a boolean"),
    ("LLAMA_ARG_PREFILL_ASSISTANT", "false", "LLAMA_ARG_PREFILL_ASSISTANT=false (--no-prefill-assistant): not yet"),
])
def test_a_bad_or_refused_variable_is_one_line_naming_it(clean_env, capsys, name, text, message):
    clean_env.setenv(name, text)
    with pytest.raises(SystemExit) as info:
        parse([])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and f"lamplight serve: error: {message}" in err, err


def test_a_refused_switch_set_off_is_no_refusal(clean_env):
    """--skip-chat-parsing is refused; its variable set off means --no-skip-chat-parsing, accepted."""
    clean_env.setenv("LLAMA_ARG_SKIP_CHAT_PARSING", "0")
    clean_env.setenv("LLAMA_ARG_KV_OFFLOAD", "off")
    assert sorted(accepted_notes(parse([]))) == [
        "LLAMA_ARG_KV_OFFLOAD=off: lamplight keeps the KV cache on the model's device",
        "LLAMA_ARG_SKIP_CHAT_PARSING=0: lamplight parses chat replies (the default)"]


# -- refusals, unknown flags, values -----------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--mmproj-url", "x"], "--mmproj-url: not yet in lamplight: download the projector first"),
    (["--video-fps", "1"], "--video-fps: not yet: video input (images are supported: --mmproj)"),
    (["--kv-unified-per-slot", "2"], "--kv-unified-per-slot: not yet: the shared KV pool across slots"),
    (["-td", "2"], "-td: the draft model runs on the model's own threads (-t)"),
    (["--draft", "16"], "--draft: the argument has been removed from llama-server (use --spec-draft-n-max)"),
    (["--control-vector-layer-range", "1", "4"], "--control-vector-layer-range: not yet in lamplight"),
])
def test_a_refused_flag_is_one_line_naming_it(clean_env, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        parse(["-c", "512", *argv, "-np", "2"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(f"lamplight serve: error: {message}") and err.count("\n") == 1


def test_speculative_flags_fill_the_engine_options(clean_env, capsys):
    """--spec-type and the n-gram sizes as llama-server spells them; a draft-model kind is refused."""
    spec = lambda argv: engine_options(parse(argv)).speculative  # noqa: E731
    assert spec([]).kinds == () and not spec([]).enabled
    given = spec(["--spec-type", "ngram-simple,ngram-mod", "--spec-ngram-simple-size-n", "4",
                  "--spec-ngram-simple-size-m", "16", "--spec-ngram-mod-n-match", "8", "--spec-ngram-map-k4v-min-hits", "2"])
    assert given.kinds == ("ngram-simple", "ngram-mod")
    assert (given.ngram_simple.size_n, given.ngram_simple.size_m, given.ngram_map_k.size_n) == (4, 16, 12)
    assert given.ngram_mod.n_match == 8 and given.ngram_map_k4v.min_hits == 2
    assert spec(["--spec-default"]).kinds == ("ngram-mod",)
    clean_env.setenv("LLAMA_ARG_SPEC_TYPE", "ngram-map-k")
    assert spec([]).kinds == ("ngram-map-k",)
    for argv, message in ((["--spec-type", "draft-mtp"], "draft-mtp: not yet"),
                          (["--spec-type", "ngram-fast"], "unknown speculative decoding type 'ngram-fast'"),
                          (["--spec-ngram-simple-size-n", "0"], "must be between 1 and 1024, got 0")):
        with pytest.raises(SystemExit):
            parse(argv)
        assert message in capsys.readouterr().err


def test_one_kv_pool_when_the_slots_are_auto_as_llama_server(clean_env):
    """-kvu is on by default only with -np auto (-1, the default); -kvu / -no-kvu / its variable decide."""
    unified = lambda argv: engine_options(parse(argv)).kv_unified  # noqa: E731
    assert unified([]) is True and unified(["-np", "-1"]) is True
    assert unified(["-np", "2"]) is False and unified(["-np", "2", "-kvu"]) is True and unified(["-no-kvu"]) is False
    clean_env.setenv("LLAMA_ARG_KV_UNIFIED", "1")
    assert unified(["-np", "2"]) is True and unified(["-np", "2", "--no-kv-unified"]) is False


def test_unknown_flags_stay_an_error_naming_them(clean_env, capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--no-such-flag", "3"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "lamplight: error: unrecognized arguments: --no-such-flag 3\n"
    with pytest.raises(SystemExit):
        parse(["--temperatur", "0.5"])  # no abbreviations, as llama-server
    assert "unrecognized arguments: --temperatur" in capsys.readouterr().err


def test_values_as_llama_server_reads_them(clean_env, tmp_path, capsys):
    keys = tmp_path / "keys.txt"
    keys.write_text("# the team's keys\nk1\n\n  k2  \n")
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    args = parse(["-np", "-1", "-c", "0", "--predict", "9", "-l", "15+1.5", "-l", "2-inf", "--api-key", "k0",
                  "--api-key-file", str(keys), "--samplers", "top_k;temperature", "-jf", str(schema),
                  "--dry-sequence-breaker", "\n", "--dry-sequence-breaker", "##", "--ignore-eos", "--typical", "0.5",
                  "--mirostat-ent", "4", "--mirostat-lr", "0.2", "--dynatemp-exp", "2", "-r", "User:", "--tags",
                  "a,b", "--chat-template-kwargs", '{"enable_thinking": false}', "--reasoning-format", "none",
                  "--reasoning-effort", "low", "-rea", "off", "--api-prefix", "/llm/", "--no-cache-prompt"])
    engine, settings = engine_options(args), server_settings(args)
    assert (engine.n_parallel, engine.n_ctx) == (4, 0)
    assert settings.api_keys == ("k0", "k1", "k2") and settings.api_prefix == "/llm" and settings.tags == ("a", "b")
    assert (settings.n_predict, settings.stop, settings.json_schema) == (9, ("User:",), {"type": "object"})
    assert settings.sampling_defaults == {
        "logit_bias": [(15, 1.5), (2, float("-inf"))], "samplers": ["top_k", "temperature"],
        "dry_sequence_breakers": ["\n", "##"], "ignore_eos": True, "typical_p": 0.5, "mirostat_tau": 4.0,
        "mirostat_eta": 0.2, "dynatemp_exponent": 2.0}
    assert settings.template_kwargs({"x": 1}) == {"reasoning_effort": "low", "enable_thinking": False, "x": 1}
    assert (settings.reasoning_format, settings.reasoning_budget, settings.cache_prompt) == ("none", 0, False)
    assert server_settings(parse(["--sampling-seq", "kt"])).sampling_defaults == {"samplers": ["top_k", "temperature"]}
    for argv, message in ((["-np", "0"], "argument -np/--parallel: must be -1 (auto) or a number of slots >= 1"),
                          (["-l", "15*2"], "argument -l/--logit-bias: expects TOKEN_ID+BIAS or TOKEN_ID-BIAS"),
                          (["--dry-sequence-breaker", "none"], "'none' (DRY without sequence breakers) is not "
                                                               "supported by lamplight"),
                          (["--samplers", "top_k;adaptive_p"], "samplers: sampler 'adaptive_p' is not supported"),
                          (["--json-schema", "[1]"], "argument -j/--json-schema: must be a JSON schema object"),
                          (["--chat-template-kwargs", "{"], "argument --chat-template-kwargs: not valid JSON"),
                          (["--api-key-file", str(tmp_path / "none.txt")], "argument --api-key-file: [Errno 2]"),
                          (["--reasoning-format", "think"], "must be one of none, auto, deepseek, deepseek-legacy")):
        with pytest.raises(SystemExit):
            parse(argv)
        assert message in capsys.readouterr().err, argv
    for argv, message in ((["--grammar", "root ::= x", "-j", "{}"], "--grammar and --json-schema: give one"),
                          (["--ssl-key-file", "k.pem"], "--ssl-key-file and --ssl-cert-file: HTTPS needs both")):
        with pytest.raises(ValueError, match=message):
            server_settings(parse(argv))


def test_router_mode_flags(clean_env):
    assert settings_from(parse([]), "router") == {"models_dir": None, "models_preset": None, "models_max": 4,
                                                  "models_autoload": True, "sleep_idle_seconds": -1}
    clean_env.setenv("LLAMA_ARG_MODELS_MAX", "2")
    args = parse(["--models-dir", "/models", "--no-models-autoload", "--sleep-idle-seconds", "60"])
    assert settings_from(args, "router") == {"models_dir": "/models", "models_preset": None, "models_max": 2,
                                             "models_autoload": False, "sleep_idle_seconds": 60}


# -- the server-wide defaults a request reads --------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from lamplight.gguf.file import GGUFFile
    from lamplight.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")))


def test_requests_start_from_the_server_wide_defaults(clean_env, tokenizer):
    settings = server_settings(parse(["-r", "User:", "--grammar", 'root ::= "ok"', "--reasoning-format", "none",
                                      "--no-cache-prompt", "-l", "3-inf"]))
    params = parse_generation_params({"prompt": "x"}, Endpoint.NATIVE, settings, tokenizer, 4)
    assert params.request.stop == ["User:"] and params.request.cache_prompt is False
    assert (params.constraint.kind, params.constraint.source) == ("grammar", 'root ::= "ok"')
    assert params.sampling.logit_bias == [(3, float("-inf"))]
    own = parse_generation_params({"prompt": "x", "stop": ["\n"], "json_schema": {"type": "object"},
                                   "cache_prompt": True, "logit_bias": []}, Endpoint.NATIVE, settings, tokenizer, 4)
    assert own.request.stop == ["\n"] and own.constraint.kind == "json_schema" and own.request.cache_prompt
    assert own.sampling.logit_bias == []
    chat = parse_generation_params({"messages": []}, Endpoint.CHAT, settings, tokenizer, 4)
    assert chat.reasoning_format == "none"


# -- where it listens: prefix, UNIX socket, keys, HTTPS ----------------------------------------

def test_prefix_socket_key_file_and_default_grammar_on_a_tiny_model(tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    keys = tmp_path / "keys"
    keys.write_text("# comment\nsecret\n")
    grammar = tmp_path / "ok.gbnf"
    grammar.write_text('root ::= "ok"\n')
    sock = Path(f"/tmp/lamplight-test-{os.getpid()}.sock")
    command = [sys.executable, "-m", "lamplight.cli", "serve", "-m", str(model), "--host", str(sock), "-c", "512",
               "-np", "2", "--api-prefix", "/llm", "--api-key-file", str(keys), "--grammar-file", str(grammar),
               "--tags", "tiny,test", "-t", "1"]
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLAMA_ARG_")}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**env, "PYTHONUNBUFFERED": "1"})
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://lamplight", timeout=30)
    try:
        _wait_for_socket(client, process)
        key = {"Authorization": "Bearer secret"}
        assert client.get("/llm/v1/models").status_code == 401
        for path in ("/llm/v1/models", "/v1/models"):  # under the prefix, and as before
            assert client.get(path, headers=key).json()["data"][0]["meta"]["n_ctx"] == 256, path
        assert client.get("/llmx/v1/models", headers=key).status_code == 404  # not the prefix
        assert client.post("/llm/props", headers=key, json={}).status_code == 501  # no --props
        body = client.post("/llm/completion", headers=key, json={"prompt": "hi", "n_predict": 8}).json()
        assert body["content"] == "ok"  # --grammar-file: requests without a constraint of their own
    finally:
        client.close()
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("lamplight serve did not stop on SIGINT")
    assert process.returncode == 0, err
    assert f"listening on unix:{sock}" in err and not sock.exists()
    assert "kernels: native" not in err or "; 1 threads" in err  # -t 1 reaches the native pool


def _wait_for_socket(client: httpx.Client, process: subprocess.Popen, seconds: float = 60) -> None:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"no answer on the socket (exit status {process.poll()})")


def _self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    key, cert = folder / "key.pem", folder / "cert.pem"
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor openssl is installed to make a test certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
        return key, cert
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                               x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(private, hashes.SHA256()))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return key, cert


def test_https_with_llama_servers_ssl_flags(tmp_path, clean_env):
    key, cert = _self_signed_certificate(tmp_path)
    port = free_port()
    settings = server_settings(parse(["--port", str(port), "--ssl-key-file", str(key), "--ssl-cert-file", str(cert),
                                      "--api-prefix", "/api"]))
    state = ServerState(settings)
    server = uvicorn_server(state)

    class ReadyEngine:
        is_ready = True

        def stop(self):
            pass

    result = []
    thread = threading.Thread(target=lambda: result.append(serve(state, lambda: (object(), ReadyEngine()), server)),
                              daemon=True)
    thread.start()
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=10) as client:
            answer = _wait_https(client, f"https://127.0.0.1:{port}/api/health")
            assert answer.json() == {"status": "ok"}
        with pytest.raises(httpx.TransportError):  # plain HTTP on an HTTPS port
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        server.should_exit = True
        thread.join(10)
    assert result == [0]


def _wait_https(client: httpx.Client, url: str, seconds: float = 30) -> httpx.Response:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            response = client.get(url)
            if response.status_code == 200:
                return response
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered 200")


def test_cors_flags(clean_env):
    from starlette.testclient import TestClient

    from lamplight.server.app import create_app

    settings = server_settings(parse(["--cors-origins", "localhost", "--cors-methods", "GET", "--cors-headers",
                                      "Authorization", "--no-cors-credentials"]))
    with TestClient(create_app(ServerState(settings))) as client:
        preflight = client.options("/v1/models", headers={"Origin": "http://localhost:5173",
                                                          "Access-Control-Request-Headers": "X-Other"})
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert (preflight.headers["access-control-allow-methods"], preflight.headers["access-control-allow-headers"]) \
            == ("GET", "Authorization")
        assert "access-control-allow-credentials" not in preflight.headers
        elsewhere = client.options("/v1/models", headers={"Origin": "http://example.com"})
        assert "access-control-allow-origin" not in elsewhere.headers
    assert ServerSettings().origin_allowed("http://example.com")  # the default, *, with credentials


def test_server_wide_defaults_the_model_must_accept(clean_env, tokenizer):
    """Checked once the model is loaded, before the server is ready: a start-up error naming the flag."""
    from lamplight.cli import _default_problem

    def problem(argv):
        return _default_problem(server_settings(parse(argv)), tokenizer)

    assert problem(["--grammar", 'root ::= "ok"', "-l", f"{tokenizer.vocab_size - 1}+1"]) is None
    assert problem(["-l", f"{tokenizer.vocab_size}-inf"]) == (
        f"-l/--logit-bias: token id {tokenizer.vocab_size} is outside the vocabulary of {tokenizer.vocab_size} tokens")
    assert "--grammar" in problem(["--grammar", "root ::= ("])
    assert "--json-schema" in problem(["-j", '{"type": "nonsense"}'])
