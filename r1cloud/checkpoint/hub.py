"""Pushing a merged model folder to the Hugging Face Hub (or any endpoint speaking its API, through
HF_ENDPOINT), with huggingface_hub: the repository is created if missing, then the folder is
uploaded as one commit."""

from __future__ import annotations

from pathlib import Path


class HubError(Exception):
    pass


def push_folder(folder: str | Path, repo_id: str, *, private: bool, message: str) -> str:
    """Upload `folder` to the model repository `repo_id`; returns the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=message)
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status in (401, 403):
            raise HubError(
                f"the Hub refused {repo_id!r} ({status}): set HF_TOKEN to a token with write access "
                "(or run `hf auth login`)"
            ) from None
        raise HubError(f"pushing to {repo_id!r} failed: {str(e).splitlines()[0]}") from None
    except Exception as e:  # connection refused, DNS, timeouts: the HTTP client's own types
        raise HubError(f"cannot push to {repo_id!r}: {type(e).__name__}: {e}") from None
    return str(info)
