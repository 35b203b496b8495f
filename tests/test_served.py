"""A served engine (rlwb/engines/served.py) against real vLLM OpenAI-compatible servers started from the `vllm-v1`
environment on the default model (a free port each, stopped at the end: `tests.conftest.vllm_server`)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.measure import metrics as M
from rlwb.core.scoring.rollouts import sample_and_score
from rlwb.engines import Sampling
from rlwb.engines.presets import served_preset
from rlwb.engines.served import ServedEngine
from rlwb.errors import EngineError
from rlwb.experiments.audit import PROBE_TEXT
from tests.conftest import free_port

pytestmark = pytest.mark.engines
FLOOR = 1e-4
# as the vllm-v1-processed preset runs in-process: processed logprobs, whole-prompt prefill (prefix caching on)
PROCESSED = ("--logprobs-mode", "processed_logprobs", "--no-enable-chunked-prefill", "--max-logprobs", "64",
             "--served-model-name", "rlwb-default")
RAW = ("--no-enable-chunked-prefill", "--max-logprobs", "5")  # vLLM V1's default raw logprobs, a capped server
T07 = Sampling(temperature=0.7, max_tokens=16, seed=0)


@pytest.fixture(scope="module")
def hub_like():
    from rlwb.core.models.store import build_embedded_model

    return build_embedded_model("default-sampling-defaults", progress=False)


@pytest.fixture(scope="module")
def servers(vllm_server, hub_like):
    vllm_server.start(*PROCESSED)  # all three start at once
    vllm_server.start(*RAW)
    vllm_server.start(*PROCESSED, model=hub_like.path)  # vLLM's default --generation-config auto
    return vllm_server(*PROCESSED), vllm_server(*RAW), vllm_server(*PROCESSED, model=hub_like.path)


@pytest.fixture(scope="module")
def probe(default_model):
    return PROBE_TEXT, PromptCodec(default_model.path).encode(PROBE_TEXT)


def test_processed_logprobs_sit_at_the_float_floor_with_the_in_process_engines_tokens(servers, probe, scorer, engine,
                                                                                       prompts):
    """vLLM promises the same tokens for the same seed on the same engine build and settings; the server runs the
    engine core in its own process (the preset in the worker's), which gave bitwise equal outputs here."""
    with ServedEngine(servers[0], probe=probe, full_logprobs=64) as w:
        ro = sample_and_score(w, scorer, prompts, T07, full=True)
        info = w.info()
    e, t = ro.flat()
    assert float(np.max(np.abs(e - t))) <= FLOOR
    m = M.mismatch_metrics(e, t, full_engine=ro.full_engine, full_trainer=ro.full_trainer)
    assert m["full_kl_mean"] <= 1e-8  # whole distributions over the 64 tokens, not only the sampled ones
    inproc = engine("vllm-v1-processed").generate(prompts, T07)
    assert [c.token_ids for c in ro.completions] == [c.token_ids for c in inproc]
    assert max(float(np.max(np.abs(a.logprobs - b.logprobs))) for a, b in zip(ro.completions, inproc)) <= 1e-5
    # what the server says about itself, for run.json
    assert info["server_version"] == "0.32.0" and info["served_model"] == "rlwb-default"
    assert info["echo"]["system_fingerprint"].startswith("vllm-0.32.0")
    assert info["model_entry"]["max_model_len"] == 4096 and info["tokenizer_probe"]["match"]
    assert any(ln.startswith("vllm:cache_config_info{") for ln in info["metrics_info"])


def test_raw_logprobs_show_the_raw_gap(servers, probe, scorer, prompts):
    """V1's default: the reported logprobs are the trainer's T = 1 ones while it samples at T = 0.7."""
    with ServedEngine(servers[1], probe=probe) as w:
        ro = sample_and_score(w, scorer, prompts, T07)
    e, t = ro.flat()
    raw = np.concatenate(ro.logp_trainer_raw).astype(np.float64)
    assert float(np.max(np.abs(e - raw))) <= FLOOR and float(np.max(np.abs(e - t))) > 1e-2


def _one_line(err: pytest.ExceptionInfo, *parts: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg and all(p in msg for p in parts), msg


def test_an_unreachable_url_a_model_not_served_a_capped_server_and_another_tokenizer(servers, probe, chat_smoke_model):
    port = free_port()
    with pytest.raises(EngineError) as e:
        ServedEngine(f"http://127.0.0.1:{port}/v1", probe=probe)
    _one_line(e, f"cannot reach the server at http://127.0.0.1:{port}/version", "Connection refused")
    with pytest.raises(EngineError) as e:
        ServedEngine(served_preset(servers[0], "gpt-9"), probe=probe)
    _one_line(e, "model 'gpt-9' is not served here (it serves: rlwb-default)")
    with pytest.raises(EngineError) as e:
        ServedEngine(servers[1], probe=probe, full_logprobs=64)
    _one_line(e, "refuses 64 logprobs per step", "--max-logprobs 64", "greater than max allowed: 5")
    chat = PromptCodec(chat_smoke_model.path)  # the trainer holds another model than the server serves
    with pytest.raises(EngineError) as e:
        ServedEngine(servers[0], probe=(PROBE_TEXT, chat.encode(PROBE_TEXT)))
    _one_line(e, "its tokenizer is not the trainer's", "first difference at token 0")


def test_a_server_that_returns_no_logprobs_is_refused(probe):
    """A stand-in server, for the one fault a real vLLM cannot be made to show: it answers completions without
    logprobs (as OpenAI-compatible servers without logprob support do). Everything else it answers as vLLM."""
    text, ids = probe

    class Handler(BaseHTTPRequestHandler):
        def _send(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send({"version": "0.0-test"} if self.path == "/version" else {"data": [{"id": "m"}]})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._send({"tokens": ids} if self.path == "/tokenize" else
                       {"choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}]})

        def log_message(self, *a):
            pass

    port = free_port()
    server = HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EngineError) as e:
            ServedEngine(f"http://127.0.0.1:{port}/v1", probe=probe)
        _one_line(e, "returned no logprobs for a request that asked for them")
    finally:
        server.shutdown()


def test_a_server_on_a_checkpoint_with_sampling_defaults_samples_what_is_asked(servers, probe, hub_like):
    """vLLM's server takes a checkpoint's generation_config.json as its default sampling parameters (here a 1.3
    repetition penalty, top-k 5, top-p 0.8, T 0.6): a request that leaves them out is sampled with them, far from
    the trainer; the served engine sends every field neutral and sits at the float floor. Open-ended prompts: where
    the policy hesitates, truncation and penalties move the logprobs (on its peaked task prompts they barely do)."""
    import urllib.request

    from rlwb.core.prompts.generated import open_ended_prompts
    from rlwb.core.scoring.trainer import TrainerScorer

    trainer = TrainerScorer(hub_like.path)
    prompts = open_ended_prompts(4, 0, PromptCodec(hub_like.path))
    with ServedEngine(servers[2], probe=probe) as w:
        ro = sample_and_score(w, trainer, prompts, T07)
    e, t = ro.flat()
    assert float(np.max(np.abs(e - t))) <= FLOOR
    gaps = []
    for prompt in prompts:  # no repetition_penalty, top_k, top_p: the server's defaults
        body = {"model": "rlwb-default", "prompt": prompt, "max_tokens": 16, "temperature": 0.7, "seed": 0,
                "logprobs": 0, "return_tokens_as_token_ids": True}
        req = urllib.request.Request(servers[2] + "/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            lp = json.loads(r.read())["choices"][0]["logprobs"]
        ref = trainer.score([prompt], [[int(x.split(":")[1]) for x in lp["tokens"]]], temperature=0.7)["logp"][0]
        gaps.append(float(np.max(np.abs(np.asarray(lp["token_logprobs"]) - ref))))
    assert max(gaps) > 0.1, gaps  # the defaults reached the sampler
