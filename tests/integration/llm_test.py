#!/usr/bin/python3
"""Black-box tests of `flotilla replica` serving a language model (the llm runtime) over the
OpenAI routes (docs/llm.md).

The model is a tiny random-weight Llama (tests/fixtures/make_llm.py) with the Llama 3 style
tokenizer of tests/fixtures/make_tokenizers.py; its text is gibberish, so the tests check the
protocol, determinism and consistency between routes, not the words.

    FLOTILLA_BIN=build/release/flotilla /usr/bin/python3 -m unittest -v tests/integration/llm_test.py
"""

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (FLOTILLA_BIN, parse_metrics, promtool_check_metrics, req,  # noqa: E402
                     wait_until)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
_tmp = None
CHAT_MODEL = None        # model directory with tokenizer files
TOKEN_ONLY_MODEL = None  # the same weights without them


def setUpModule():
    global _tmp, CHAT_MODEL, TOKEN_ONLY_MODEL
    harness.require_binary("llm_test.py")
    _tmp = tempfile.mkdtemp(prefix="flotilla-llm-it-")
    subprocess.run(["/usr/bin/python3", os.path.join(FIXTURES, "make_tokenizers.py"), _tmp],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["/usr/bin/python3", os.path.join(FIXTURES, "make_llm.py"), _tmp,
                    "--with-tokenizer", os.path.join(_tmp, "llama3")], check=True)
    CHAT_MODEL = os.path.join(_tmp, "chat")
    TOKEN_ONLY_MODEL = os.path.join(_tmp, "token-only")
    os.makedirs(TOKEN_ONLY_MODEL)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(CHAT_MODEL, name), TOKEN_ONLY_MODEL)


def tearDownModule():
    if _tmp:
        shutil.rmtree(_tmp, ignore_errors=True)


def stream(port, path, body):
    """POSTs with stream: true; returns (status, content type, [parsed events], raw body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=harness.HTTP_TIMEOUT_S)
    try:
        conn.request("POST", path, json.dumps(dict(body, stream=True)),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read().decode()
        events = []
        for block in raw.split("\n\n"):
            if block.startswith("data: "):
                payload = block[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return r.status, r.getheader("Content-Type"), events, raw
    finally:
        conn.close()


def assert_openai_error(test, r, status, fragment):
    test.assertEqual(r.status, status, r)
    error = r.json()["error"]
    test.assertIn(fragment, error["message"], r)
    test.assertEqual(error["code"], status)
    test.assertIsInstance(error["type"], str)
    return error


class ChatModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # runtime auto: the config.json makes it an llm directory.
        cls.server = harness.start_process(
            cls, [FLOTILLA_BIN, "replica", "--model", CHAT_MODEL, "--port", "0",
                  "--llm-threads", "2", "--kv-cache-tokens", "2048"], cls_level=True)
        cls.port = cls.server.port

    def complete(self, **body):
        r = req(self.port, "POST", "/v1/completions", dict(body))
        self.assertEqual(r.status, 200, r)
        return r.json()

    def test_models_route_names_the_model_and_its_context(self):
        r = req(self.port, "GET", "/v1/models")
        self.assertEqual(r.status, 200, r)
        model = r.json()["data"][0]
        self.assertEqual(model["id"], "chat")
        self.assertEqual(model["max_model_len"], 256)

    def test_text_completion_has_the_openai_shape_and_counts(self):
        j = self.complete(model="chat", prompt="The quick brown fox", max_tokens=7,
                          temperature=0, ignore_eos=True, return_token_ids=True)
        self.assertEqual(j["object"], "text_completion")
        choice = j["choices"][0]
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(len(choice["token_ids"]), 7)
        self.assertEqual(j["usage"]["completion_tokens"], 7)
        self.assertGreater(j["usage"]["prompt_tokens"], 1)  # BOS and the words
        self.assertEqual(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"] + 7)

    def test_greedy_is_deterministic_and_streaming_gives_the_same_text(self):
        body = dict(prompt="Hello world! How are you", max_tokens=20, temperature=0,
                    ignore_eos=True, return_token_ids=True)
        first, second = self.complete(**body), self.complete(**body)
        self.assertEqual(first["choices"][0]["text"], second["choices"][0]["text"])
        status, content_type, events, raw = stream(self.port, "/v1/completions", body)
        self.assertEqual(status, 200, raw)
        self.assertTrue(content_type.startswith("text/event-stream"))
        self.assertEqual(events[-1], "[DONE]")
        chunks = events[:-1]
        self.assertEqual("".join(c["choices"][0]["text"] for c in chunks),
                         first["choices"][0]["text"])
        self.assertEqual([t for c in chunks for t in c["choices"][0].get("token_ids", [])],
                         first["choices"][0]["token_ids"])
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")
        self.assertTrue(all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]))
        self.assertEqual(len({c["id"] for c in chunks}), 1)

    def test_token_id_prompt_equals_the_text_prompt_it_encodes_to(self):
        text = self.complete(prompt="The dog", max_tokens=5, temperature=0, ignore_eos=True,
                             return_token_ids=True, logprobs=1)
        self.assertIsNotNone(text["choices"][0]["logprobs"])
        # The prompt's ids, recovered from a run that echoes nothing: the token count matches.
        ids = self.complete(prompt=[1, 2, 3], max_tokens=5, temperature=0, ignore_eos=True)
        self.assertEqual(ids["usage"]["prompt_tokens"], 3)

    def test_seeded_sampling_reproduces(self):
        body = dict(prompt="Numbers matter", max_tokens=12, temperature=1.0, top_p=0.9,
                    top_k=50, seed=42, ignore_eos=True, return_token_ids=True)
        a, b = self.complete(**body), self.complete(**body)
        self.assertEqual(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"])

    def test_stop_string_cuts_the_text_before_it(self):
        body = dict(prompt="We serve models for many users", max_tokens=24, temperature=0,
                    ignore_eos=True)
        full = self.complete(**body)["choices"][0]["text"]
        # A stop string from the middle of the greedy text (ASCII only, so it is one that the
        # decoder emits whole).
        start = next((i for i in range(4, len(full) - 2)
                      if full[i:i + 2].isascii() and full[i:i + 2].strip()), None)
        if start is None:
            self.skipTest(f"greedy text has no ASCII pair to stop on: {full!r}")
        stop = full[start:start + 2]
        cut = self.complete(**body, stop=[stop])["choices"][0]
        self.assertEqual(cut["finish_reason"], "stop")
        self.assertEqual(cut["text"], full[:full.index(stop)])

    def test_chat_completion_whole_and_streamed(self):
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hello, how are you?"}]
        r = req(self.port, "POST", "/v1/chat/completions",
                {"model": "chat", "messages": messages, "max_tokens": 10, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        j = r.json()
        self.assertEqual(j["object"], "chat.completion")
        self.assertEqual(j["choices"][0]["message"]["role"], "assistant")
        self.assertIn(j["choices"][0]["finish_reason"], ("length", "stop"))
        status, _, events, raw = stream(
            self.port, "/v1/chat/completions",
            {"messages": messages, "max_tokens": 10, "temperature": 0,
             "stream_options": {"include_usage": True}})
        self.assertEqual(status, 200, raw)
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(events[-1], "[DONE]")
        usage = events[-2]
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["completion_tokens"], j["usage"]["completion_tokens"])
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
        self.assertEqual(text, j["choices"][0]["message"]["content"])

    def test_bad_requests_get_openai_errors_and_change_nothing(self):
        cases = [
            ("/v1/completions", b"{not json", 400, "JSON"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
            ("/v1/completions", {"prompt": "x", "temperature": 9}, 400, "temperature"),
            ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
            ("/v1/completions", {"prompt": "x", "n": 3}, 400, "'n'"),
            ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "other"),
            ("/v1/completions", {"prompt": "word " * 300}, 400, "context"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 1000}, 400, "context"),
            ("/v1/completions", {"prompt": [1, 5000]}, 400, "5000"),
            ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
            ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
             "role"),
        ]
        for path, body, status, fragment in cases:
            with self.subTest(body=body):
                r = req(self.port, "POST", path, body,
                        headers={"Content-Type": "application/json"})
                assert_openai_error(self, r, status, fragment)
        r = req(self.port, "POST", "/v2/models/chat/infer",
                {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]})
        self.assertEqual(r.status, 501, r)
        self.assertIn("/v1/completions", r.json()["error"])
        self.assertEqual(req(self.port, "GET", "/v1/completions").status, 405)
        self.assertEqual(self.metric("flotilla_llm_running_sequences"), 0)

    def metric(self, name):
        r = req(self.port, "GET", "/metrics")
        return parse_metrics(r.body.decode())[(name, frozenset())]

    def test_client_disconnect_mid_stream_frees_the_sequence(self):
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        body = json.dumps({"prompt": "Hello", "max_tokens": 200, "temperature": 0,
                           "ignore_eos": True, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        self.assertIn(b"200", sock.recv(4096))
        sock.close()
        # Whether the engine was cancelled mid-way or had finished (this model is fast), the
        # sequence must be gone and its blocks back, and the server must serve on.
        wait_until(lambda: self.metric("flotilla_llm_running_sequences") == 0 and
                   self.metric("flotilla_llm_kv_blocks_used") == 0, 10,
                   what="the sequence's blocks freed")
        self.complete(prompt="x", max_tokens=2, ignore_eos=True)

    def test_metrics_pass_promtool_and_count_tokens(self):
        self.complete(prompt="count me", max_tokens=3, ignore_eos=True)
        text = req(self.port, "GET", "/metrics").body.decode()
        ok, output = promtool_check_metrics(text)
        self.assertTrue(ok, output)
        metrics = parse_metrics(text)
        self.assertGreaterEqual(metrics[("flotilla_llm_generated_tokens_total", frozenset())], 3)
        self.assertGreater(metrics[("flotilla_llm_kv_blocks_free", frozenset())], 0)
        self.assertGreaterEqual(
            metrics[("flotilla_llm_time_to_first_token_seconds_count", frozenset())], 1)


class TokenOnlyModelTest(unittest.TestCase):
    """A directory without tokenizer files: refused unless --skip-tokenizer, then ids only."""

    def test_without_tokenizer_files_the_replica_refuses_to_start(self):
        r = harness.run_to_exit([FLOTILLA_BIN, "replica", "--model", TOKEN_ONLY_MODEL,
                                 "--port", "0"], deadline_s=20)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"--skip-tokenizer", r.stderr)

    def test_skip_tokenizer_serves_token_ids_and_refuses_text(self):
        server = harness.start_process(
            self, [FLOTILLA_BIN, "replica", "--model", TOKEN_ONLY_MODEL, "--port", "0",
                   "--skip-tokenizer", "--runtime", "llm"])
        r = req(server.port, "POST", "/v1/completions",
                {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0,
                 "return_token_ids": True})
        self.assertEqual(r.status, 200, r)
        self.assertLessEqual(len(r.json()["choices"][0]["token_ids"]), 4)
        r = req(server.port, "POST", "/v1/completions", {"prompt": "text", "max_tokens": 4})
        assert_openai_error(self, r, 400, "tokenizer")
        r = req(server.port, "POST", "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}]})
        assert_openai_error(self, r, 400, "tokenizer")


class NotALanguageModelTest(unittest.TestCase):
    def test_bad_model_directories_fail_with_a_clear_message(self):
        broken = os.path.join(_tmp, "broken")
        shutil.copytree(TOKEN_ONLY_MODEL, broken)
        with open(os.path.join(broken, "config.json")) as f:
            config = json.load(f)
        config["num_hidden_layers"] = 3  # the file has 2 layers
        with open(os.path.join(broken, "config.json"), "w") as f:
            json.dump(config, f)
        r = harness.run_to_exit([FLOTILLA_BIN, "replica", "--model", broken, "--port", "0",
                                 "--skip-tokenizer"], deadline_s=20)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(b"model.layers.2.", r.stderr)



def _bytes_of_shown_token(token):
    """The bytes a logprobs token string stands for: "bytes:\\xNN..." or its UTF-8."""
    if token.startswith("bytes:"):
        return bytes(int(h, 16) for h in token[len("bytes:"):].split("\\x")[1:])
    return token.encode()


class LogprobsAndPenaltiesTest(unittest.TestCase):
    """Issue 18: logprobs of byte-level tokens (one entry per token, raw bytes), the sampling
    penalties' effect on greedy output, and GET /v1/models/{id}."""

    @classmethod
    def setUpClass(cls):
        cls.server = harness.start_process(
            cls, [FLOTILLA_BIN, "replica", "--model", CHAT_MODEL, "--port", "0",
                  "--llm-threads", "2", "--kv-cache-tokens", "2048"], cls_level=True)
        cls.port = cls.server.port

    def complete(self, **body):
        r = req(self.port, "POST", "/v1/completions", dict(body))
        self.assertEqual(r.status, 200, r)
        return r.json()["choices"][0]

    def test_top_logprobs_keep_every_byte_token_apart(self):
        # The fixture's vocabulary has the 256 single bytes and many pieces of CJK characters:
        # tokens that decode to U+FFFD (or, unused ids, to nothing) alone.
        choice = self.complete(prompt="Hello world", max_tokens=30, temperature=0,
                               ignore_eos=True, logprobs=20)
        logprobs = choice["logprobs"]
        self.assertEqual([len(top) for top in logprobs["top_logprobs"]], [20] * 30)
        pieces = [sum(k.startswith("bytes:") for k in top) for top in logprobs["top_logprobs"]]
        self.assertGreaterEqual(max(pieces), 2, "no position with two pieces of characters")
        for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"]):
            self.assertNotIn("\ufffd", token)
            if token.startswith("bytes:"):
                # Shown as OpenAI does: only what is not valid UTF-8 is written as bytes.
                with self.assertRaises(UnicodeDecodeError):
                    _bytes_of_shown_token(token).decode()
            # Greedy: the chosen token is the first of the top ones, under the same key.
            self.assertEqual(token, max(top, key=top.get))

    def test_chat_logprob_bytes_are_the_tokens_raw_bytes(self):
        r = req(self.port, "POST", "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 20,
                 "temperature": 0, "logprobs": True, "top_logprobs": 5})
        self.assertEqual(r.status, 200, r)
        choice = r.json()["choices"][0]
        content = choice["logprobs"]["content"]
        self.assertEqual(len(content), r.json()["usage"]["completion_tokens"])
        replacement = list("\ufffd".encode())
        saw_piece = False
        for entry in content:
            for item in [entry] + entry["top_logprobs"]:
                if item["token"].startswith("token_id:"):  # an id the vocabulary leaves unused
                    self.assertIsNone(item["bytes"], item)
                    continue
                self.assertEqual(bytes(item["bytes"]), _bytes_of_shown_token(item["token"]), item)
                self.assertNotEqual(item["bytes"], replacement, item)
                saw_piece = saw_piece or item["token"].startswith("bytes:")
            self.assertEqual(len({t["token"] for t in entry["top_logprobs"]}), 5, entry)
        self.assertTrue(saw_piece, "no piece of a character among the tokens")
        # The chosen tokens' bytes make the text (its incomplete characters as U+FFFD).
        raw = b"".join(bytes(e["bytes"] or b"") for e in content)
        self.assertEqual(raw.decode("utf-8", "replace").replace("\ufffd", ""),
                         choice["message"]["content"].replace("\ufffd", ""))

    def test_presence_and_frequency_penalties_steer_greedy_decoding(self):
        body = dict(prompt="Hello world", max_tokens=30, temperature=0, ignore_eos=True,
                    return_token_ids=True)
        plain = self.complete(**body)["token_ids"]
        self.assertLess(len(set(plain)), len(plain), "the fixture's greedy text repeats tokens")
        for presence, frequency in ((2, 0), (0, 1.5), (0.5, 0.5)):
            with self.subTest(presence=presence, frequency=frequency):
                choice = self.complete(**body, logprobs=20, presence_penalty=presence,
                                       frequency_penalty=frequency)
                self.assertNotEqual(choice["token_ids"], plain)
                # Each greedy choice is the argmax of the model's logprobs (reported unpenalized)
                # less the penalties of what was generated before it (OpenAI's formula).
                tokens, tops = choice["logprobs"]["tokens"], choice["logprobs"]["top_logprobs"]
                for i, (token, top) in enumerate(zip(tokens, tops)):
                    def score(key):
                        count = tokens[:i].count(key)
                        return top[key] - frequency * count - presence * (count > 0)
                    if token in top:
                        self.assertEqual(token, max(top, key=score), (i, token))

    def test_repetition_penalty_changes_greedy_output_reproducibly(self):
        body = dict(prompt="Hello world", max_tokens=30, temperature=0, ignore_eos=True,
                    return_token_ids=True)
        plain = self.complete(**body)["token_ids"]
        penalized = self.complete(**body, repetition_penalty=2)["token_ids"]
        self.assertNotEqual(penalized, plain)
        self.assertEqual(self.complete(**body, repetition_penalty=2)["token_ids"], penalized)
        self.assertEqual(self.complete(**body, repetition_penalty=1)["token_ids"], plain)
        for field, value in (("repetition_penalty", 0), ("presence_penalty", 3),
                             ("min_p", 2), ("best_of", 3), ("logit_bias", {"5": 101})):
            with self.subTest(field=field):
                r = req(self.port, "POST", "/v1/completions",
                        dict(prompt="x", max_tokens=2, **{field: value}))
                assert_openai_error(self, r, 400, f"'{field}'")

    def test_logit_bias_forces_and_bans_tokens(self):
        body = dict(prompt="Hello world", max_tokens=8, temperature=0, ignore_eos=True,
                    return_token_ids=True)
        plain = self.complete(**body)["token_ids"]
        forced = next(t for t in range(3, 700) if t not in plain)
        self.assertEqual(self.complete(**body, logit_bias={str(forced): 100})["token_ids"],
                         [forced] * 8)
        banned = self.complete(**body, logit_bias={str(plain[0]): -100})["token_ids"]
        self.assertNotIn(plain[0], banned)
        r = req(self.port, "POST", "/v1/completions",
                dict(prompt="x", max_tokens=2, logit_bias={"5000": 1}))
        assert_openai_error(self, r, 400, "5000")

    def test_min_p_one_is_greedy(self):
        body = dict(prompt="Numbers matter", max_tokens=12, ignore_eos=True, return_token_ids=True)
        greedy = self.complete(**body, temperature=0)["token_ids"]
        self.assertEqual(self.complete(**body, temperature=1, min_p=1, seed=3)["token_ids"], greedy)

    def test_model_route_names_the_model(self):
        r = req(self.port, "GET", "/v1/models/chat")
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.json()["id"], r.json()["object"], r.json()["max_model_len"]),
                         ("chat", "model", 256))
        self.assertEqual(req(self.port, "GET", "/v1/models").json()["data"], [r.json()])
        assert_openai_error(self, req(self.port, "GET", "/v1/models/other"), 404, "other")

    def test_invocations_is_501_in_mlflow_shape(self):
        # docs/replica.md: a language model serves no MLflow pyfunc.
        r = req(self.port, "POST", "/invocations", {"instances": [[1, 2, 3]]})
        self.assertEqual(r.status, 501, r)
        self.assertEqual(r.json()["error_code"], "NOT_IMPLEMENTED")
        self.assertIn("/v1/completions", r.json()["message"])


if __name__ == "__main__":
    unittest.main()
