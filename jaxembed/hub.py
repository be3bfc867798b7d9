"""Push an export folder to the Hugging Face hub: ``jaxembed export ... --push-to-hub ORG/NAME [--private]``.

Through ``huggingface_hub``: ``HfApi.create_repo`` (a new repository: public, or private with ``private=True``),
``create_branch`` for a ``revision`` other than ``main``, then ``upload_folder`` (one commit with every file of the
folder). The token is the usual one: ``HF_TOKEN``, else the one ``hf auth login`` saved; the hub address is
``HF_ENDPOINT`` (default https://huggingface.co). Every failure (no token, a token the hub refuses, no write access,
no network, ``HF_HUB_OFFLINE``) is one UserError line naming the repository and the fix.

An existing repository is pushed to as it is; with ``private=True`` an existing *public* repository is refused
(``create_repo`` would leave it public, and the files would be published).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jaxembed.errors import UserError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def check_repo_id(repo_id: str, flag: str = "--push-to-hub") -> str:
    """``ORG/NAME`` (a user or an organisation, then the model's name), else UserError."""
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith(
            (".git", ".")):
        raise UserError(f"{flag} {repo_id!r}: not a hub repository id (fix: ORG/NAME, e.g. my-org/my-embedder: "
                        "letters, digits, '-', '_', '.')")
    return repo_id


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def require_token(repo_id: str, token: str | None = None) -> str:
    """The token to push with (``token``, ``HF_TOKEN``, or the saved login); UserError when there is none."""
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise UserError(f"--push-to-hub {repo_id}: no Hugging Face token (fix: export HF_TOKEN=hf_... with a token "
                        "that can write to that organisation, or run `hf auth login`)")
    return token


def check_offline(repo_id: str) -> None:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise UserError(f"--push-to-hub {repo_id}: HF_HUB_OFFLINE is set, so nothing can be sent to the hub (fix: "
                        "unset HF_HUB_OFFLINE for the push)")


def check_access(repo_id: str, token: str | None = None) -> None:
    """Before any work (``jaxembed export --push-to-hub`` checks this before it exports): a repository id, no
    offline mode, a token, and the hub accepting it (``whoami``; a read-only token is refused). One line each."""
    from huggingface_hub import HfApi

    check_repo_id(repo_id)
    check_offline(repo_id)
    api = HfApi(token=require_token(repo_id, token))
    try:
        me = api.whoami()
    except Exception as e:  # noqa: BLE001
        raise UserError(f"--push-to-hub {repo_id} ({api.endpoint}): checking the token failed: "
                        f"{_describe(e)}") from None
    role = ((me.get("auth") or {}).get("accessToken") or {}).get("role") if isinstance(me, dict) else None
    if role == "read":
        raise UserError(f"--push-to-hub {repo_id} ({api.endpoint}): the token is read-only (fix: a token with write "
                        "access: https://huggingface.co/settings/tokens)")


def push_folder(folder: str | os.PathLike, repo_id: str, *, private: bool = False, revision: str | None = None,
                commit_message: str | None = None, token: str | None = None) -> str:
    """Upload every file of ``folder`` (an export) to the model repository ``repo_id`` in one commit; returns the
    commit's URL. Creates the repository (``private``) when it does not exist, and the branch ``revision``."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    check_repo_id(repo_id)
    folder = Path(folder)
    if not ((folder / "config.json").is_file() or (folder / "modules.json").is_file()):
        raise UserError(f"{folder}: not a model folder (no config.json / modules.json); nothing pushed (fix: export "
                        "the model there first)")
    check_offline(repo_id)
    token = require_token(repo_id, token)
    api = HfApi(token=token)
    where = f"--push-to-hub {repo_id} ({api.endpoint})"
    step = "creating the repository"
    try:
        try:
            api.create_repo(repo_id, repo_type="model", private=True if private else None, exist_ok=False)
        except HfHubHTTPError as e:
            if e.response is None or e.response.status_code != 409:  # 409: it exists already
                raise
            step = "reading the existing repository"
            info = api.repo_info(repo_id, repo_type="model")
            if private and not info.private:
                raise UserError(f"{where}: the repository exists and is public, and --private does not change an "
                                "existing repository: nothing was pushed (fix: make it private on the hub first, or "
                                "drop --private)") from None
        if revision and revision != "main":
            step = f"creating the branch {revision!r}"
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        step = "uploading the folder"
        from jaxembed import __version__

        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", revision=revision,
                                 commit_message=commit_message or f"Upload {folder.name} (jaxembed {__version__})")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 -- every failure of the client becomes one line
        raise UserError(f"{where}: {step} failed: {_describe(e)}") from None
    return str(getattr(info, "commit_url", info))


def _describe(e: BaseException) -> str:
    """One line for an error of huggingface_hub (HTTP status, network, offline mode, bad metadata)."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    first = " ".join(str(e).split("\n")[0].split())[:300]
    if isinstance(e, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set (fix: unset it for the push)"
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        server = " ".join(str(getattr(e, "server_message", "") or "").split())[:200]
        said = f" ({server})" if server else ""
        if status == 401:
            return (f"the hub refused the token (HTTP 401){said} (fix: a valid token in HF_TOKEN, or `hf auth "
                    "login` again)")
        if status == 403:
            return (f"the token may not write there (HTTP 403){said} (fix: a token with write access to that "
                    "user / organisation)")
        if status == 404:
            return f"not found (HTTP 404){said} (fix: check the repository id and the revision)"
        return f"HTTP {status}{said or ': ' + first} (fix: try again; check the hub's status)"
    if type(e).__module__.split(".")[0].startswith("httpx") or isinstance(e, (ConnectionError, TimeoutError)):
        return (f"cannot reach the hub ({type(e).__name__}: {first}) (fix: check the network, or HF_ENDPOINT if you "
                "set it)")
    if isinstance(e, ValueError) and "metadata" in str(e).lower():
        detail = " ".join(str(e).split())[:300]
        return f"the hub refused the model card's metadata: {detail} (fix: correct README.md's front matter)"
    return f"{type(e).__name__}: {first}"
