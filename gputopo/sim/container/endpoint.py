"""The inference service's OpenAI-compatible HTTP endpoint, served on loopback.

``/health``, ``/v1/models`` and ``/v1/chat/completions`` (it answers arithmetic: "7 x 13" ->
91) for both servers; SGLang's ``/get_server_info`` and vLLM's ``/metrics`` carry the KV cache
size. The ``hung_endpoint`` and ``wrong_answer`` faults change what it does.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid as _uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gputopo.sim import state
from gputopo.sim.container.faults import faults_of
from gputopo.sim.container.lifecycle import Container
from gputopo.sim.container.paths import SimPaths
from gputopo.sim.container.server_args import served_model, service_flavor

_ARITH_RE = re.compile(
    r"(-?\d+(?:\.\d+)?)\s*(x|\*|×|times|multiplied by|\+|plus|-|minus|/|divided by)\s*(-?\d+(?:\.\d+)?)",
    re.IGNORECASE,
)


def answer_arithmetic(question: str) -> str | None:
    """The result of the first ``a <op> b`` in ``question`` ("What is 7 x 13?" -> "91"), or None."""
    m = _ARITH_RE.search(question)
    if not m:
        return None
    a, op, b = float(m.group(1)), m.group(2).lower(), float(m.group(3))
    if op in ("x", "*", "×", "times", "multiplied by"):
        r = a * b
    elif op in ("+", "plus"):
        r = a + b
    elif op in ("-", "minus"):
        r = a - b
    else:
        if b == 0:
            return "undefined"
        r = a / b
    return str(int(r)) if r == int(r) else f"{r:g}"


class EndpointServer:
    """The container's OpenAI-compatible HTTP endpoint, served on loopback by the simulator.

    Every request reads the container's state from files: with no active inference service
    (container stopped, service inactive, failed, or still loading its model) the connection is
    closed without a reply, like a server that is not listening. The URL is recorded in ``<run>/endpoint-<vmid>.json``.
    """

    def __init__(self, sim_dir: str | os.PathLike, vmid: int, host: str = "127.0.0.1", port: int = 0):
        self.sim_dir = Path(sim_dir)
        self.vmid = int(vmid)
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # keep test and serve output clean
                pass

            def do_GET(self):
                outer._handle(self, "GET")

            def do_POST(self):
                outer._handle(self, "POST")

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> EndpointServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        state.write_state(
            SimPaths(self.sim_dir).run, f"endpoint-{self.vmid}", {"url": self.url, "vmid": self.vmid}
        )
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        ct = Container(self.sim_dir, self.vmid)
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        active = ct.active_server()
        # a server still loading its model does not listen yet (SGLang's and vLLM's launchers
        # start their HTTP server once the model is loaded): the unit is "activating" until then
        if active is None or float(active[1].get("ready_at", 0.0)) > time.time():
            req.close_connection = True
            return
        if self._hang_if_hung():
            req.close_connection = True
            return
        unit, svc = active
        argv = svc.get("argv", [])
        flavor = service_flavor(argv)
        model = served_model(argv)
        path = req.path.split("?", 1)[0]
        if method == "GET" and path == "/health":
            return self._send(req, 200, b"", None)
        if method == "GET" and path == "/v1/models":
            return self._json(req, 200, _models(svc, model, flavor))
        if method == "POST" and path == "/v1/chat/completions":
            return self._chat(req, body, model)
        if flavor == "sglang" and method == "GET" and path == "/get_server_info":
            return self._json(
                req,
                200,
                {
                    "model_path": model,
                    "tp_size": svc.get("tp", 1),
                    "max_total_num_tokens": self._kv_tokens(ct, svc),
                    "version": "0.4.6",
                },
            )
        if flavor == "vllm" and method == "GET" and path == "/metrics":
            text = _vllm_metrics(model, self._kv_tokens(ct, svc) // 16)
            return self._send(req, 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        return self._json(req, 404, {"detail": "Not Found"})

    def _hang_if_hung(self) -> bool:
        """Hold the request as a hung server does (fault ``hung_endpoint``, until its seconds pass
        or the server stops); False when the endpoint is not hung."""
        hang = faults_of(self.sim_dir, self.vmid).get("hung_endpoint")
        if hang is None:
            return False
        deadline = time.monotonic() + float(hang.get("seconds", 3600))
        while time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        return True

    @staticmethod
    def _kv_tokens(ct: Container, svc: dict) -> int:
        if svc.get("kv_tokens") is not None:  # the engine's own figure (footprint.start)
            return int(svc["kv_tokens"])
        # a model the simulator cannot read: 30% of the memory held, 128 KiB per token
        used = ct.gpu_memory_used()
        kv_mib = sum(used.get(a, 0) for a in svc.get("gpus", [])) * 0.3
        return int(kv_mib * 1024 // 128)

    def _chat(self, req, body: bytes, model: str) -> None:
        try:
            payload = json.loads(body or b"{}")
            messages = payload["messages"]
            question = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
        except (ValueError, KeyError, TypeError, StopIteration):
            return self._json(
                req,
                400,
                {
                    "object": "error",
                    "message": "messages with a user turn are required",
                    "type": "BadRequestError",
                    "code": 400,
                },
            )
        answer = answer_arithmetic(str(question))
        wrong = faults_of(self.sim_dir, self.vmid).get("wrong_answer")
        if wrong is not None:
            answer = str(
                wrong.get("answer", int(answer) + 1 if answer and answer.lstrip("-").isdigit() else "42")
            )
        content = f"The answer is {answer}." if answer is not None else "I can only do arithmetic."
        now = int(time.time())
        return self._json(
            req,
            200,
            {
                "id": f"chatcmpl-{_uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": now,
                "model": payload.get("model") or model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": len(str(question).split()),
                    "completion_tokens": len(content.split()),
                    "total_tokens": len(str(question).split()) + len(content.split()),
                },
            },
        )

    def _json(self, req, status: int, data: Any) -> None:
        self._send(req, status, json.dumps(data).encode(), "application/json")

    @staticmethod
    def _send(req, status: int, body: bytes, ctype: str | None) -> None:
        req.send_response(status)
        if ctype:
            req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)


def _models(svc: dict, model: str, flavor: str) -> dict:
    """The OpenAI ``/v1/models`` answer: the one model the server serves."""
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": int(svc.get("started", 0)),
                "owned_by": flavor,
                "root": model,
            }
        ],
    }


def _vllm_metrics(model: str, blocks: int) -> str:
    """vLLM's ``/metrics`` (Prometheus text): its KV-cache blocks and running requests."""
    return (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",gpu_memory_utilization="0.9",'
        f'num_cpu_blocks="0",num_gpu_blocks="{blocks}"}} 1.0\n'
        "# HELP vllm:num_gpu_blocks Number of GPU KV-cache blocks\n"
        "# TYPE vllm:num_gpu_blocks gauge\n"
        f'vllm:num_gpu_blocks{{model_name="{model}"}} {float(blocks)}\n'
        "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'
    )
