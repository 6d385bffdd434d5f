"""Format prompts: the Jinja template over each row's `content` (EasyR1's `data.format_prompt`),
read and rendered the same way by the trainer, `try`, `eval`, `chat` and `validate`.

A template is a file from elsewhere, so it renders in Jinja's sandbox: no attribute tricks into
Python's internals, `range()` capped (100,000), no `include`/`import` (no loader). `check` renders
one real row with a time and size limit and names the template's line that fails — what would
otherwise end a run after the GPUs are rented. Jinja's sandbox is the library made for this; only
the time limit is ours (a signal timer, on the main thread).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from pathlib import Path

MAX_CHARS = 1_000_000  # a rendered prompt longer than this is a mistake, not a prompt
SECONDS = 5.0


def load(path: str | Path):
    """The template in `path`, compiled in the sandbox (jinja2's TemplateSyntaxError if it is not one)."""
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment().from_string(Path(path).read_text(encoding="utf-8").strip())


class TooSlow(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float):
    """TooSlow raised in the block after `seconds` (a signal timer: the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread: no limit elsewhere
        return

    def expire(*_):
        raise TooSlow

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _template_line(error: BaseException) -> str:
    """' (line N)' of the template where rendering failed, from Jinja's rewritten traceback."""
    lines = [n for f, n in traceback.walk_tb(error.__traceback__) if f.f_code.co_filename == "<template>"]
    return f" (line {lines[-1]})" if lines and lines[-1] else ""


def check(path: str | Path, content: str, seconds: float = SECONDS) -> str | None:
    """Why the template in `path` cannot render `content` — one line naming the template's line —
    or None when it renders within `seconds` and MAX_CHARS."""
    import jinja2

    try:
        template = load(path)
    except jinja2.TemplateSyntaxError as e:
        return f"line {e.lineno}: not a valid Jinja template: {e.message}"
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot be read ({type(e).__name__}: {e})"
    size = 0
    try:
        with deadline(seconds):
            for piece in template.generate(content=content):
                size += len(piece)
                if size > MAX_CHARS:
                    return f"renders more than {MAX_CHARS:,} characters for one row: is a loop unbounded?"
    except TooSlow:
        return f"takes more than {seconds:g} s to render one row: is a loop unbounded?"
    except RecursionError as e:
        return f"recurses without end when rendered{_template_line(e)}"
    except Exception as e:  # ZeroDivisionError, an unknown filter, include without a loader, the sandbox
        message = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        return f"fails when rendered{_template_line(e)}: {type(e).__name__}: {message}".rstrip(": ")
    return None


def placeholders(path: str | Path | None) -> int:
    """How many `<image>` placeholders the template adds around `content` (EasyR1 splits the prompt
    at them after the format prompt is applied, so a template may place the picture); 0 for a
    template that does not render (`check` names why)."""
    if not path or check(path, ""):
        return 0
    return load(path).render(content="").count("<image>")
