"""Where and as whom gputopo reaches the Proxmox API: :class:`ApiConfig` and the secrets.

Secrets come only from the environment (``GPUTOPO_PVE_PASSWORD``, ``GPUTOPO_PVE_TOKEN`` =
``user@realm!tokenid=secret``, ``GPUTOPO_PVE_TOKEN_SECRET``) or from an owner-only file; they
never appear in ``repr``, logs or error messages.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gputopo.errors import ConfigError
from gputopo.model.strict import Strict

ENV_PASSWORD = "GPUTOPO_PVE_PASSWORD"
ENV_TOKEN = "GPUTOPO_PVE_TOKEN"
ENV_TOKEN_SECRET = "GPUTOPO_PVE_TOKEN_SECRET"
WHOLE_WORDS_BELOW = 8  # a secret shorter than this is masked only where it stands as a whole word


class ApiConfig(Strict):
    """Where and as whom to reach the Proxmox API. Holds no secret.

    ``secret_file`` names an owner-only file holding the password (password login) or the
    token secret (``token_name`` set); the environment variables take precedence.
    """

    backend: Literal["https", "local"] = "https"
    host: str = "127.0.0.1"
    port: int = 8006
    node: str = "pve1"
    user: str = "root@pam"
    token_name: str | None = None
    verify_ssl: bool = True
    ca_bundle: str | None = None
    fingerprint: str | None = None  # SHA-256 of the node's certificate, AA:BB:... (pins it)
    timeout: float = 60.0
    task_timeout: float = 300.0
    poll_interval: float = 0.5
    secret_file: str | None = None


@dataclass(repr=False)
class Credentials:
    """Who logs in: an API token (``token_name`` and ``token_secret``) or a password. The
    ``repr`` shows no secret."""

    user: str
    token_name: str | None = None
    token_secret: str | None = None
    password: str | None = None

    def __repr__(self) -> str:
        return f"Credentials({self.user}{'!' + self.token_name if self.token_name else ''})"

    def scrub(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``.

        A short secret is masked only where it stands whole: one that begins or ends with a
        letter or digit must not continue a word there (a password ``on`` leaves
        ``connection`` alone), since a message names hosts and reasons in ordinary words. A
        secret of 8 characters or more is no part of an ordinary word: it is masked wherever
        it appears.
        """
        for s in (self.token_secret, self.password):
            if s:
                text = scrub_secret(text, s)
        return text


def scrub_secret(text: str, secret: str) -> str:
    """``text`` with ``secret`` replaced by ``***`` (see :meth:`Credentials.scrub`)."""
    if len(secret) >= WHOLE_WORDS_BELOW:
        return text.replace(secret, "***")
    head = r"(?<![A-Za-z0-9])" if secret[0].isalnum() else ""
    tail = r"(?![A-Za-z0-9])" if secret[-1].isalnum() else ""
    return re.sub(head + re.escape(secret) + tail, "***", text)


def read_secret_file(path: str) -> str:
    """The first line of ``path``; refuses a file that group or others can read.

    Raises ConfigError naming the file when it is missing, unreadable or not owner-only.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read secret file ({e.strerror})") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path}: secret file must be readable by its owner only (mode {stat.S_IMODE(st.st_mode):04o}; chmod 600 it)"
        )
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read secret file ({e.strerror})") from None
    secret = text.strip().splitlines()[0] if text.strip() else ""
    if not secret:
        raise ConfigError(f"{path}: secret file is empty")
    return secret


_TOKEN_ID_RE = re.compile(r"^(?:(?P<user>[^!\s]+@[^!\s]+)!)?(?P<tid>[A-Za-z][A-Za-z0-9._-]*)$")


def split_token_id(token_name: str, user: str) -> tuple[str, str]:
    """(user, token id) of ``--token-name``: ``gputopo`` (the token of ``user``) or the full
    id as the web UI's API token list shows it, ``root@pam!gputopo`` (pve-access-control's
    ``user@realm!tokenid``). Raises ConfigError for another form, or a full id whose user is
    not ``user`` when that is not the default root@pam."""
    m = _TOKEN_ID_RE.match(token_name.strip())
    if not m:
        raise ConfigError(f"--token-name {token_name}: expected TOKENID or user@realm!TOKENID")
    if m["user"] is None:
        return user, m["tid"]
    if user not in ("root@pam", m["user"]):
        raise ConfigError(f"--token-name {token_name} is a token of {m['user']}, not of --user {user}")
    return m["user"], m["tid"]


def resolve_credentials(cfg: ApiConfig, env: dict[str, str]) -> Credentials:
    """The credentials ``cfg`` asks for, from ``env`` or the secret file.

    ``GPUTOPO_PVE_TOKEN`` wins; then a token secret when ``cfg.token_name`` is set; else a
    password. ``cfg.token_name`` may be the full id the web UI shows (``root@pam!gputopo``):
    its user part then names the user. Raises ConfigError when none is given, the token is
    malformed or names another user than ``cfg.user``.
    """
    user, token_name = cfg.user, cfg.token_name
    if token_name:
        user, token_name = split_token_id(token_name, user)
    full = env.get(ENV_TOKEN)
    if full:
        m = re.match(r"^(?P<user>[^!\s]+@[^!\s]+)!(?P<tid>[A-Za-z][A-Za-z0-9._-]*)=(?P<secret>\S+)$", full)
        if not m:
            raise ConfigError(f"{ENV_TOKEN}: expected user@realm!tokenid=secret")
        return Credentials(m["user"], token_name=m["tid"], token_secret=m["secret"])
    if token_name:
        secret = env.get(ENV_TOKEN_SECRET) or (read_secret_file(cfg.secret_file) if cfg.secret_file else None)
        if not secret:
            raise ConfigError(f"token {user}!{token_name}: set {ENV_TOKEN_SECRET} or a secret file")
        return Credentials(user, token_name=token_name, token_secret=secret)
    password = env.get(ENV_PASSWORD) or (read_secret_file(cfg.secret_file) if cfg.secret_file else None)
    if not password:
        raise ConfigError(f"{user}: no credentials: set {ENV_PASSWORD}, {ENV_TOKEN} or a secret file")
    return Credentials(user, password=password)
