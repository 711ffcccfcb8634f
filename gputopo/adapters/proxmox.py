"""The real Proxmox VE adapters: both implement ``gputopo.ports.ProxmoxPort``.

* :class:`HttpsClient` -- the API over HTTPS through proxmoxer (an API token, or a root@pam
  password turned into a ticket);
* :class:`LocalClient` -- ``pvesh`` on the node itself (:mod:`gputopo.adapters.pvesh`).

:meth:`ProxmoxClient.from_config` builds the one an :class:`ApiConfig` asks for; the calls
themselves are :class:`gputopo.adapters.pvecalls.PveCalls`. Secrets come from
:mod:`gputopo.adapters.credentials` and never appear in ``repr``, logs or errors.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from typing import Any

from gputopo.adapters.credentials import ENV_PASSWORD, ApiConfig, Credentials, resolve_credentials
from gputopo.adapters.pvecalls import PveCalls
from gputopo.adapters.pvesh import Pvesh, Runner
from gputopo.errors import ConfigError, ConnectFailed, LoginFailed, ProxmoxError, TaskTimeout


class ProxmoxClient(PveCalls):
    """A Proxmox VE API client: the ``ProxmoxPort`` calls of :class:`PveCalls` (and the errors
    they raise) over one backend, which :meth:`from_config` picks."""

    status_known = True  # the API tells whether a guest runs
    guests_known = True  # and which guests the node has

    @staticmethod
    def from_config(
        cfg: ApiConfig, env: dict[str, str] | None = None, runner: Runner | None = None
    ) -> ProxmoxClient:
        """Connect as ``cfg`` says. ``env`` defaults to ``os.environ``; ``runner`` replaces the
        way the local backend runs ``pvesh`` (tests pass a fake).

        Raises ConfigError for missing/unsafe credentials or options, ProxmoxError when the
        password login is refused.
        """
        if cfg.backend == "local":
            return LocalClient(cfg, Pvesh(runner, cfg.timeout))
        return HttpsClient.connect(cfg, dict(os.environ if env is None else env))

    @property
    @abstractmethod
    def address(self) -> str:
        """Where the API is reached, for messages: its URL, or ``pvesh (--local)``."""

    @abstractmethod
    def identity(self) -> str:
        """The authenticated user id, e.g. ``root@pam`` or ``root@pam!gputopo`` for a token."""

    @abstractmethod
    def can_change_devices(self) -> tuple[bool, str]:
        """Whether this login may set or delete ``devN`` (Proxmox allows only root@pam).

        Returns (ok, why): ``why`` says what works when ``ok`` is False.
        """


class LocalClient(ProxmoxClient):
    """``ProxmoxPort`` through ``pvesh`` on the node: root@pam, tasks run synchronously."""

    def __init__(self, cfg: ApiConfig, pvesh: Pvesh):
        super().__init__(cfg)
        self._pvesh = pvesh

    def __repr__(self) -> str:
        return f"LocalClient(root@pam at local pvesh, node {self.node})"

    @property
    def address(self) -> str:
        return "pvesh (--local)"

    __str__ = __repr__

    def _call(self, method: str, path: str, _timeout: float | None = None, **params: Any) -> Any:
        return self._pvesh.call(method, path, params, timeout=_timeout)

    def _start_task(self, path: str, params: dict[str, Any], what: str, timeout: float) -> Any:
        # pvesh runs the task in the foreground: the command may take as long as the step
        # allows, and outliving that is the task's timeout
        try:
            return self._call("POST", path, _timeout=timeout, **params)
        except ProxmoxError as e:
            if e.status is None and e.pve_message.startswith("timed out after"):
                raise TaskTimeout(None, what, timeout) from None
            raise

    def identity(self) -> str:
        """root@pam: pvesh runs as root@pam on the node."""
        return "root@pam"

    def can_change_devices(self) -> tuple[bool, str]:
        return True, "pvesh on the node runs as root@pam"


class HttpsClient(ProxmoxClient):
    """``ProxmoxPort`` over HTTPS through proxmoxer. Build it with :meth:`connect`."""

    def __init__(self, api: Any, cfg: ApiConfig, creds: Credentials):
        super().__init__(cfg)
        self._api = api
        self._user = creds.user
        self._token_name = creds.token_name

    def __repr__(self) -> str:
        return (
            f"HttpsClient({self.identity()} at https://{self._cfg.host}:{self._cfg.port}, node {self.node})"
        )

    __str__ = __repr__

    @property
    def address(self) -> str:
        host = self._cfg.host
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return f"https://{host}:{self._cfg.port}"

    @classmethod
    def connect(cls, cfg: ApiConfig, env: dict[str, str]) -> HttpsClient:
        """Log in as ``cfg`` says with the credentials in ``env`` (or ``cfg.secret_file``).

        With ``cfg.fingerprint`` every connection must present that certificate
        (:mod:`gputopo.adapters.pinning`), else ``cfg.ca_bundle`` or the system CAs check it
        (``cfg.verify_ssl`` False: nothing does). A token is tried with one ``GET /version``, so
        a wrong secret fails here, before anything else.

        Raises ConfigError for missing/unsafe credentials or a missing CA bundle, LoginFailed
        when the login is refused or the certificate is not the pinned one, ProxmoxError when
        the host cannot be reached.
        """
        creds = resolve_credentials(cfg, env)
        if cfg.ca_bundle and not os.path.isfile(cfg.ca_bundle):
            raise ConfigError(f"{cfg.ca_bundle}: CA bundle not found")
        api = _login(cfg, creds)
        client = cls(api, cfg, creds)
        if creds.token_name:
            try:
                client.version()
            except ProxmoxError as e:
                if e.status == 401:
                    raise LoginFailed(
                        "GET /version", 401, f"{e.pve_message} (API token {client.identity()})"
                    ) from None
                raise
        return client

    def _call(self, method: str, path: str, _timeout: float | None = None, **params: Any) -> Any:
        from proxmoxer.core import ResourceException

        call = f"{method} {path}"
        res = self._api(path.lstrip("/"))
        try:
            if method == "GET":
                return res.get(**params)
            if method == "POST":
                return res.post(**params)
            if method == "PUT":
                return res.put(**params)
            return res.delete(**params)
        except ResourceException as e:
            message = str(e.content or e.status_message or "").strip().splitlines()
            if e.status_code == 401:  # the token (or ticket) is refused: nothing can be done with it
                raise LoginFailed(call, 401, message[0] if message else "authentication failure") from None
            errors = e.errors if isinstance(e.errors, dict) and "errors" not in e.errors else None
            raise ProxmoxError(call, e.status_code, message[0] if message else "", errors) from None
        except ProxmoxError:
            raise
        except Exception as e:
            from gputopo.adapters.pinning import presented_fingerprint

            got = presented_fingerprint(e)
            if got:
                raise LoginFailed(
                    call,
                    None,
                    f"the certificate's SHA-256 fingerprint is {got}, not the pinned {self._cfg.fingerprint}",
                ) from None
            from gputopo.adapters.neterrors import connection_reason

            raise ProxmoxError(call, None, connection_reason(e, self._cfg.host)) from None

    def identity(self) -> str:
        """The authenticated user id (``root@pam!gputopo`` for a token)."""
        return f"{self._user}!{self._token_name}" if self._token_name else self._user

    def can_change_devices(self) -> tuple[bool, str]:
        if self._token_name:
            return False, (
                f"API token {self.identity()} may not configure device passthrough (devN): only root@pam may; "
                f"log in with a ticket as root@pam ({ENV_PASSWORD}) or use the local backend on the node"
            )
        if self._user != "root@pam":
            return False, (
                f"user {self._user} may not configure device passthrough (devN): only root@pam may; "
                f"log in as root@pam ({ENV_PASSWORD}) or use the local backend on the node"
            )
        return True, "ticket login as root@pam"


def _login(cfg: ApiConfig, creds: Credentials) -> Any:
    """The proxmoxer API logged in with ``creds``: a pinned certificate (``cfg.fingerprint``), else
    one ``cfg.ca_bundle`` or the system CAs check (``cfg.verify_ssl`` False: none). Raises
    LoginFailed when the login is refused or the certificate is not the pinned one,
    ConnectFailed when the host cannot be reached."""
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import AuthenticationError

    from gputopo.adapters.pinning import pinned_api, presented_fingerprint

    verify: bool | str = cfg.ca_bundle if (cfg.verify_ssl and cfg.ca_bundle) else cfg.verify_ssl
    where = f"connect https://{cfg.host}:{cfg.port}"
    try:
        if cfg.fingerprint:
            api = pinned_api(
                cfg.host,
                cfg.port,
                cfg.fingerprint,
                creds.user,
                cfg.timeout,
                password=creds.password,
                token_name=creds.token_name,
                token_value=creds.token_secret,
            )
        else:
            kw: dict[str, Any] = dict(
                host=cfg.host,
                port=cfg.port,
                user=creds.user,
                verify_ssl=verify,
                timeout=cfg.timeout,
                service="PVE",
            )
            if creds.token_name:
                api = ProxmoxAPI(
                    backend="https", token_name=creds.token_name, token_value=creds.token_secret, **kw
                )
            else:
                api = ProxmoxAPI(backend="https", password=creds.password, **kw)
    except AuthenticationError:
        raise LoginFailed("POST /access/ticket", 401, f"authentication failure for {creds.user}") from None
    except Exception as e:  # requests' connection/TLS errors; never echo the secret
        got = presented_fingerprint(e)
        if got:
            raise LoginFailed(
                where,
                None,
                f"the certificate's SHA-256 fingerprint is {got}, not the pinned {cfg.fingerprint}",
            ) from None
        from gputopo.adapters.neterrors import connection_reason, expired, expired_message

        if expired(e):
            raise ConnectFailed(where, None, expired_message(cfg.host, cfg.port, cfg.timeout)) from None
        reason = connection_reason(e, cfg.host)
        raise ConnectFailed(where, None, creds.scrub(reason), tls_hint(e, cfg.ca_bundle)) from None
    return api


PVE_CA = "/etc/pve/pve-root-ca.pem"


def tls_hint(exc: BaseException, ca_bundle: str | None) -> str:
    """The known fix for a connection error, or '': a certificate that is not trusted is
    usually a node's self-signed one, whose CA every node keeps in ``/etc/pve/pve-root-ca.pem``."""
    text = f"{type(exc).__name__} {exc}"
    if "CERTIFICATE_VERIFY_FAILED" not in text and "SSLError" not in text:
        return ""
    if ca_bundle:
        return f"the certificate does not chain to {ca_bundle}; pass the node's {PVE_CA} as --ca-bundle"
    return f"pass --ca-bundle {PVE_CA} (copied from the node) or --insecure"
