"""`serve` and `chat`: a checkpoint behind an OpenAI-compatible endpoint, and talking to one."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from r1cloud.checkpoint.store import NotFound
from r1cloud.cli.common import app, err, fail, failing, load_blueprint, need_file, not_nan, out, report_end
from r1cloud.core.jobstore import ACTIVE, Job, JobStore
from r1cloud.jobs import follow as f
from r1cloud.jobs import local
from r1cloud.jobs.cloud import CloudError, serve_up
from r1cloud.jobs.sky_task import TaskError, service_config
from r1cloud.serving import chat as ch
from r1cloud.serving import serve as sv

# chat's and eval's: Option objects, not aliases, as eval's values may be None and chat's have defaults.
MaxTokensOption = typer.Option("--max-tokens", min=1, max=10_000_000, help="Tokens per answer at most.")
TemperatureOption = typer.Option("--temperature", min=0.0, max=100.0, callback=not_nan, help="0 is greedy.")


def merging(checkpoint, out_dir, note: str, dtype: str = "bf16", adapter_only: bool = False) -> None:
    """Merge `checkpoint` for an engine here (serve, chat, eval), saying so first: `note` follows its ID."""
    from r1cloud.checkpoint.merge import MergeError, merge

    err.print(f"{checkpoint.id}{note}", markup=False)
    try:
        merge(checkpoint, out_dir, dtype, adapter_only=adapter_only)
    except MergeError as e:
        fail("error: cannot write the adapter" if adapter_only else "error: cannot merge", [str(e)])


def _merge_for_serving(checkpoint, out_dir) -> None:
    if checkpoint.inference_ready:  # a bucket's merged model, fetched by merging its weights here
        merging(checkpoint, out_dir, f": fetching the model from the bucket into {out_dir}…")
    else:
        merging(checkpoint, out_dir, " is not INFERENCE READY: merging it first…")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(
    ctx: typer.Context,
    checkpoint: Annotated[
        str,
        typer.Option(
            "--checkpoint",
            "-c",
            help="JOB[:step-N] (default step: the last), a checkpoint or model folder, a bucket URL, or a Hub id.",
        ),
    ],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8000,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 0.0.0.0 opens it to the network.")
    ] = "127.0.0.1",
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="R1CLOUD_API_KEY",
            help="Require this bearer key (401 without it). Also read from R1CLOUD_API_KEY.",
            show_default=False,
        ),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="Model name clients use (default: JOB-step-N).")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option("--max-model-len", min=1, max=10_000_000, help="Context length limit.")
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="auto (vLLM when installed), vllm, or transformers.")
    ] = "auto",
    infra: Annotated[
        str,
        typer.Option("--infra", help="local, or a SkyPilot infra (aws, gcp, k8s, …) for a SkyServe service."),
    ] = "local",
    replicas: Annotated[
        str, typer.Option("--replicas", help="Cloud: a replica count (2) or an autoscaling range (1-4).")
    ] = "1",
    gpu: Annotated[str, typer.Option("--gpu", help="Cloud: each replica's accelerator.")] = "L4:1",
    name: Annotated[str | None, typer.Option("--name", help="Job name (default: serve-MODEL).")] = None,
    detach: Annotated[
        bool,
        typer.Option("--detach", "-d", help="Start, wait until ready, and return; stop with r1cloud stop."),
    ] = False,
    ready_timeout: Annotated[
        float,
        typer.Option(
            "--ready-timeout",
            min=1.0,
            max=86_400.0,
            callback=not_nan,
            help="Seconds to wait for /v1/models to answer.",
        ),
    ] = 900.0,
    tool_call_format: Annotated[
        str,
        typer.Option(
            "--tool-call-format",
            help="OpenAI tool calling (`tools=` in, `tool_calls` out) through vLLM's tool parser:"
            " hermes, python (r1cloud's <tool_call>f(a=1)</tool_call>), none, or auto (the job's own"
            " format when its run called tools).",
        ),
    ] = "auto",
    adapter: Annotated[
        bool,
        typer.Option(
            "--adapter",
            help="A LoRA run's checkpoint: serve its base model with the adapter on top (vLLM's"
            " --enable-lora; the adapter answers to the served name, the base to NAME-base) instead"
            " of the merged model.",
        ),
    ] = False,
) -> None:
    """Serve a checkpoint behind an OpenAI-compatible API (/v1/models, /v1/completions,
    /v1/chat/completions), merging it first when it is not INFERENCE READY. Runs as a job: `jobs`
    shows its URL, `logs` its output; Ctrl-C (or `r1cloud stop`) stops it. Arguments after `--`
    go to the engine, e.g. `-- --enforce-eager`."""
    with failing(sv.ServeError):
        tools = sv.tool_format(tool_call_format, checkpoint)
    if infra != "local":
        _serve_in_cloud(
            checkpoint, infra, gpu, replicas, api_key, served_model_name, max_model_len, name, tools
        )
        return
    if replicas != "1":
        fail(f"error: --replicas {replicas} needs a cloud --infra", ["locally, one server runs"])
    with failing(sv.ServeError, NotFound):
        chosen_engine = sv.pick_engine(engine)
        sv.check_port(host, port)
        if adapter and chosen_engine != "vllm":
            fail("error: --adapter needs vLLM", ["use --engine vllm, or serve the merged model"])
        if adapter:
            model = sv.resolve_adapter(
                checkpoint,
                lambda c: merging(c, None, ": writing its adapter folder first…", adapter_only=True),
            )
        else:
            model = sv.resolve(checkpoint, _merge_for_serving)
    served = served_model_name or model.name
    extra = list(ctx.args)
    if tools and chosen_engine != "vllm":
        err.print(
            f"note: the transformers engine has no tool parser: {tools} tool calls come back as text"
            " in `content` (serve with --engine vllm for `tool_calls`)",
            markup=False,
        )
    elif "--tool-call-parser" not in extra:
        extra = [*sv.tool_flags(tools), *extra]
    url = sv.base_url(host, port)
    store = JobStore()
    job = store.create_unique(
        Job(
            name or f"serve-{served}".replace("/", "-"),
            kind="serve",
            accelerators=chosen_engine,
            blueprint=checkpoint,
            command=sv.command(chosen_engine, model, host, port, served, max_model_len, extra),
            url=url,
            model=f"{served} ← {model.origin}",
        )
    )
    env = sv.kv_cache_env(model.path, max_model_len, list(ctx.args)) if chosen_engine == "vllm" else {}
    job = local.launch(store, job, sv.key_env(api_key), env)
    calling = f" · tool calls: {tools}" if tools and chosen_engine == "vllm" else ""
    out.print(
        f"serving {model.origin} as {served!r} with {chosen_engine}{calling} · job {job.name}", markup=False
    )
    if host in ("0.0.0.0", "::") and not api_key:
        err.print(
            "warning: listening on every interface with no --api-key: anyone who can reach it can use it"
        )
    with err.status(f"starting {chosen_engine} (log: {job.log})…"):
        ready = sv.wait_ready(url, api_key, lambda: store.get(job.name).status in ACTIVE, ready_timeout)
    if not ready:
        record = store.get(job.name)
        if record.status in ACTIVE:
            local.stop(store, job.name, 10)
            why = f"/v1/models did not answer within {ready_timeout:.0f}s"
        else:
            why = record.reason or "the server exited"
        tail = f.tail_lines(job.log, 200)
        cause = sv.failure_cause(tail)
        lines = [why, *tail[-12:], f"full log: r1cloud logs {job.name}"]
        err.print(
            f"error: the server did not start{': ' + cause if cause else ''}", style="bold red", markup=False
        )
        for line in lines:
            err.print(f"  {line}", markup=False)
        raise typer.Exit(1)
    out.print(f"ready: {url}  (model {served!r})", style="bold green", markup=False)
    out.print(sv.snippets(url, served, bool(api_key)), markup=False)
    if detach:
        out.print(f"logs: r1cloud logs -f {job.name}    stop: r1cloud stop {job.name}", markup=False)
        return
    err.print("Ctrl-C stops the server", markup=False)
    try:
        record = f.follow(store, job.name, lambda line: print(line, flush=True), start=job.log.stat().st_size)
    except KeyboardInterrupt:
        err.print(f"stopping {job.name}…", markup=False)
        local.stop(store, job.name, 30)
        raise typer.Exit(0) from None
    raise typer.Exit(report_end(record))


def _serve_in_cloud(checkpoint, infra, gpu, replicas, api_key, served_model_name, max_model_len, name, tools):
    try:
        if tools == "python":
            raise sv.ServeError(
                "error: the python tool-call format is read by r1cloud's vLLM plugin, which SkyServe"
                " replicas do not install yet",
                ["serve it locally, or pass --tool-call-format none (calls come back as text)"],
            )
        model = sv.resolve_for_cloud(checkpoint)
        served = served_model_name or model.name
        service = name or f"serve-{served}".replace("/", "-").lower()
        config = service_config(
            service,
            model.path,
            served,
            infra,
            gpu,
            replicas,
            bool(api_key),
            max_model_len,
            sv.tool_flags(tools),
        )
        err.print(f"starting SkyServe service {service} on {infra} ({replicas} × {gpu})…", markup=False)
        endpoint = serve_up(config, {"R1CLOUD_API_KEY": api_key} if api_key else {}, service)
    except (sv.ServeError, NotFound) as e:
        fail(*e.args)
    except (TaskError, CloudError) as e:
        fail(f"error: {e}", getattr(e, "hints", []))
    url = f"{endpoint if '://' in endpoint else 'http://' + endpoint}/v1"
    JobStore().create_unique(
        Job(service, kind="serve", infra=infra, accelerators=gpu, blueprint=checkpoint, url=url,
            model=f"{served} ← {model.origin}", cloud={"service": service}, status="RUNNING")
    )  # fmt: skip
    out.print(
        f"ready: {url}  (model {served!r}, SkyServe service {service})", style="bold green", markup=False
    )
    out.print(sv.snippets(url, served, bool(api_key)), markup=False)
    out.print(f"stop: r1cloud stop {service}    status: sky serve status {service}", markup=False)


@app.command()
def chat(
    target: Annotated[
        str,
        typer.Argument(
            help="An endpoint URL (http://…/v1), or a job, JOB:step-N, checkpoint or model folder, or Hub id."
        ),
    ],
    prompt: Annotated[
        str | None,
        typer.Argument(help="One prompt; without it, an interactive loop (or one prompt per stdin line)."),
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option("--compare", help="A second target (e.g. the base model): answers side by side."),
    ] = None,
    blueprint: Annotated[
        Path | None,
        typer.Option("--blueprint", help="Apply this blueprint's format prompt (default: the job's own)."),
    ] = None,
    format_prompt: Annotated[
        Path | None, typer.Option("--format-prompt", help="Apply this Jinja format prompt (over `content`).")
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the text as it is: no format prompt, no lead-in messages.")
    ] = False,
    show_prompt: Annotated[bool, typer.Option("--show-prompt", help="Print the message as sent.")] = False,
    image: Annotated[
        list[Path] | None,
        typer.Option(
            "--image",
            help="A picture for a vision-language model (repeat for several), sent with the first question.",
        ),
    ] = None,
    video: Annotated[
        list[Path] | None,
        typer.Option(
            "--video",
            help="A video (mp4) for a Qwen-VL model (repeat for several), sent with the first question.",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="R1CLOUD_API_KEY", help="Bearer key of the endpoint(s).", show_default=False
        ),
    ] = None,
    max_tokens: Annotated[int, MaxTokensOption] = 512,
    temperature: Annotated[float, TemperatureOption] = 0.0,
    engine: Annotated[
        str,
        typer.Option(
            "--engine", help="Engine for a checkpoint target: transformers (starts in seconds) or vllm."
        ),
    ] = "transformers",
) -> None:
    """Ask a served endpoint or a checkpoint, with the blueprint's format prompt applied; --compare
    shows a second model's answer beside it (the before/after view). A run with tools plays
    episodes: the model's tool calls run in the training sandbox between turns, each one shown."""
    spec = load_blueprint(blueprint, [], {}, str(blueprint)) if blueprint else sv.job_spec(target)
    template = spec.data.format_prompt if spec is not None and not raw else None
    if format_prompt and not raw:
        need_file("--format-prompt", format_prompt, "give a Jinja template over `content`")
        template = str(format_prompt)
    with failing(sv.ServeError):
        box = ch.Toolbox.of(spec) if spec is not None else None
    lead = ch.lead_in(spec) if spec is not None and not raw else []
    if lead:
        err.print(
            f"each conversation starts as the run's prompts do: {len(lead)} messages before the question"
            " (--raw for none)",
            markup=False,
        )
    images, videos = [str(p) for p in image or []], [str(p) for p in video or []]
    for flag, paths, kind in (("--image", images, "a PNG or JPEG file"), ("--video", videos, "an mp4 file")):
        for path in paths:
            need_file(flag, Path(path), f"give {kind}")
    if sys.stdin.isatty() or prompt is not None:
        prompts = None
    else:
        prompts = [line.strip() for line in sys.stdin if line.strip()]
    with contextlib.ExitStack() as stack:
        with failing(sv.ServeError, NotFound):
            sides = [
                stack.enter_context(ch.open_endpoint(t, api_key, engine, _merge_for_serving, box and box.fmt))
                for t in ([compare, target] if compare else [target])
            ]
        if compare:
            sides[0].label, sides[1].label = f"{compare} ({sides[0].model})", f"{target} ({sides[1].model})"
        if box is not None:
            stack.callback(box.sandbox.close)
        histories: list[list[dict]] = [list(lead) for _ in sides]
        conversations: list[int] = [0 for _ in sides]

        def turn(text: str) -> None:
            message = ch.render(template, text)
            if show_prompt:
                err.print(f"[dim]sent:[/] {message}", highlight=False)
            answers = []
            first = len(histories[0]) == len(lead)  # pictures and videos go with the first question
            for k, (side, history) in enumerate(zip(sides, histories, strict=True)):
                history.append(
                    {
                        "role": "user",
                        "content": ch.content(message, *((images, videos) if first else ([], []))),
                    }
                )
                if box is None:
                    stream = None if compare else (lambda piece: out.print(piece, end="", markup=False))
                    answer = ch.ask(side, history, max_tokens, temperature, stream)
                    history.append({"role": "assistant", "content": answer})
                    answers.append(answer)
                    continue
                if len(history) == len(lead) + 1:
                    conversations[k] = box.start(history)
                transcript: list[str] = []

                def show(kind: str, text: str, transcript: list[str] = transcript) -> None:
                    transcript.append(f"[tool] {text}" if kind == "tool" else text)
                    if not compare:  # each turn as it comes
                        out.print(transcript[-1], style="dim" if kind == "tool" else None, markup=False)

                ch.ask_with_tools(side, history, box, conversations[k], max_tokens, temperature, show)
                answers.append("\n".join(transcript))
            if not compare:
                if box is None:
                    out.print()
                return
            table = Table(title=text, title_justify="left", expand=sys.stdout.isatty())
            for side in sides:
                table.add_column(side.label, ratio=1, overflow="fold")
            table.add_row(*map(Text, answers))  # as written: brackets are not markup
            out.print(table)

        if prompt is not None or prompts is not None:
            for text in [prompt] if prompt is not None else prompts:
                if prompts is not None:
                    histories = [list(lead) for _ in sides]  # each stdin line is its own question
                turn(text)
            return
        err.print(
            f"chatting with {' and '.join(s.label for s in sides)}; empty line or Ctrl-D ends", markup=False
        )
        while True:
            try:
                text = out.input("[bold]you> [/]")
            except (EOFError, KeyboardInterrupt):
                out.print()
                return
            if not text.strip():
                return
            turn(text)
