"""A small OpenAI-compatible server on transformers, for machines without vLLM:
`python -m r1cloud.serving.openai_server MODEL [--host H] [--port P] [--served-model-name N] [--max-model-len L]`.

It answers `/v1/models`, `/v1/completions` and `/v1/chat/completions` (streaming as server-sent
events, as OpenAI's API does; a vision-language model's chat takes `image_url` parts — and for
Qwen-VL `video_url` parts, sampled at 2 frames a second as vLLM's Qwen loaders and EasyR1's
default `video_fps` do — as data URLs or file:// paths), enforces `Authorization: Bearer KEY` when R1CLOUD_API_KEY or VLLM_API_KEY is
set, and generates one request at a time. vLLM is the engine for throughput; this one is for
correctness anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator

from r1cloud.data import no_sklearn

no_sklearn.install()  # before transformers loads (this module is a process's main)

import torch
import uvicorn
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoConfig, AutoTokenizer, TextIteratorStreamer

from r1cloud.media import video, vision
from r1cloud.media.vision import auto_class, image_inputs, use_qwen2_rope

VIDEO_FPS = 2.0  # frames a second sampled from a video in a chat message


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


class Engine:
    def __init__(self, model: str, max_model_len: int | None):
        config = AutoConfig.from_pretrained(model)
        self.processor = None  # vision.ImageProcessor for a vision-language model
        if vision.is_vision_config(config):
            self.processor = vision.ImageProcessor(vision.load_processor(model))
            self.tokenizer = self.processor.tokenizer
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = auto_class(config).from_pretrained(model, dtype="auto").eval()
        use_qwen2_rope(self.model)  # the positions vLLM gives videos
        self.max_len = max_model_len or getattr(self.model.config, "max_position_embeddings", 2048)
        self.lock = threading.Lock()  # one generation at a time: the model is not re-entrant

    def chat_inputs(self, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], dict]:
        """Prompt ids and, with images, the generate kwargs that carry them. `tools` reach the chat
        template (calls come back as the text the model writes: this server has no tool parser)."""
        if self.processor is None:
            if any(isinstance(m.get("content"), list) and any(p.get("type") in ("image_url", "video_url")
                   for p in m["content"]) for m in messages):  # fmt: skip
                raise ValueError("this is a text model: it takes no images or videos")
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids), {}
        messages, images, videos = vision.split_chat(messages)
        # sized by the processor, as vLLM
        clips = [video.Clip(*video.read_frames(v, VIDEO_FPS)) for v in videos]
        enc = self.processor.encode(self.processor.apply_template(messages), images, clips)
        return enc.ids, image_inputs(self.model, torch.tensor([enc.ids]), enc.image_inputs)

    def stream(
        self, prompt_ids: list[int], body: dict, stats: dict, extra: dict | None = None
    ) -> Iterator[str]:
        """Text pieces of one completion. Once generation ends, `stats` holds "completion_tokens" and
        "finish" (the finish reason: 'stop' or 'length')."""
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        temperature = float(body.get("temperature", 1.0))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(
            input_ids=torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=temperature > 0,
            streamer=streamer,
            pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            **(extra or {}),
        )
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=float(body.get("top_p", 1.0)), top_k=0)
        result: dict = {}

        def run():
            with self.lock:
                if body.get("seed") is not None:
                    torch.manual_seed(int(body["seed"]))
                with torch.no_grad():
                    result["ids"] = self.model.generate(**kwargs)[0, len(prompt_ids) :]
                stats["completion_tokens"] = len(result["ids"])

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        text = ""
        for piece in streamer:
            cut = _stop_at(text + piece, stops)
            if cut is not None:
                yield cut[len(text) :]
                for _ in streamer:  # let generation finish; the rest is discarded
                    pass
                thread.join()
                stats["finish"] = "stop"
                return
            text += piece
            yield piece
        thread.join()
        ids = result.get("ids", torch.tensor([]))
        length = len(ids) >= max_tokens and int(ids[-1]) != self.tokenizer.eos_token_id
        stats["finish"] = "length" if length else "stop"


def _stop_at(text: str, stops: list[str]) -> str | None:
    hits = [text.index(s) for s in stops if s and s in text]
    return text[: min(hits)] if hits else None


def build_app(engine: Engine, name: str, api_key: str | None) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def auth(request: Request, call_next):
        path, given = request.url.path, request.headers.get("authorization")
        if api_key and path.startswith("/v1") and given != f"Bearer {api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @app.get("/health")
    def health():
        return {}

    @app.get("/v1/models")
    def models():
        card = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "r1cloud"}
        return {"object": "list", "data": [{**card, "max_model_len": engine.max_len}]}

    def run(body: dict, prompt_ids: list[int], chat: bool, extra: dict | None = None):
        if body.get("model") not in (None, name):
            return _error(404, f"The model `{body.get('model')}` does not exist; this server has `{name}`.")
        if int(body.get("n") or 1) != 1:
            return _error(
                400, "n > 1 is not supported by this server; use vLLM (r1cloud serve --engine vllm)"
            )
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if len(prompt_ids) + max_tokens > engine.max_len:
            return _error(
                400,
                f"This model's maximum context length is {engine.max_len} tokens; the prompt has "
                f"{len(prompt_ids)} and max_tokens asks for {max_tokens}.",
            )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": rid, "object": kind, "created": int(time.time()), "model": name}

        def choice(text: str, finish: str | None, delta: bool) -> dict:
            if not chat:
                return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            key = "delta" if delta else "message"
            return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}

        stats: dict = {}
        pieces = engine.stream(prompt_ids, body, stats, extra)
        if body.get("stream"):

            def events() -> Iterator[str]:
                chunk = {**head, "object": f"{kind}.chunk"} if chat else head
                for piece in pieces:
                    if piece:
                        yield f"data: {json.dumps({**chunk, 'choices': [choice(piece, None, True)]})}\n\n"
                yield f"data: {json.dumps({**chunk, 'choices': [choice('', stats['finish'], True)]})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        text = "".join(pieces)
        completion = stats.get("completion_tokens", 0)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(prompt_ids) + completion,
        }
        return {**head, "choices": [choice(text, stats["finish"], False)], "usage": usage}

    # Plain `def` handlers: FastAPI runs them in its thread pool, so generating never blocks the loop.
    @app.post("/v1/completions")
    def completions(body: dict = Body(...)):
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return _error(400, "prompt must be one string on this server")
        ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return run(body, ids, chat=False)

    @app.post("/v1/chat/completions")
    def chat_completions(body: dict = Body(...)):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list")
        try:
            ids, extra = engine.chat_inputs(messages, body.get("tools"))
        except (ValueError, OSError) as e:  # an image that cannot be read, or a text model given one
            return _error(400, f"cannot use an image of the request: {e}")
        return run(body, ids, chat=True, extra=extra)

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    args = parser.parse_args(argv)
    api_key = os.environ.get("R1CLOUD_API_KEY") or os.environ.get("VLLM_API_KEY")
    engine = Engine(args.model, args.max_model_len)
    app = build_app(engine, args.served_model_name or args.model, api_key)
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1 (transformers)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
