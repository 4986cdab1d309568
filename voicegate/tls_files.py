"""The TLS listener's certificate and key, checked before anything starts.

PJSIP reads ``sip.tls_cert_file`` and ``sip.tls_key_file`` only when the TLS transport is
created, and reports a bad pair as a bare OpenSSL error code from deep in ``libInit``. Loading
the same pair with Python's :mod:`ssl` first gives the operator one line naming the key and the
fix, and exit 2 (a config error) instead of 3 (a start failure), like every other bad setting.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from config import Settings


def tls_problems(settings: Settings) -> list[str]:
    """What is wrong with the TLS listener's files, one line each naming the key; empty when
    TLS is off or the pair loads (readable, PEM, the key matching the certificate)."""
    sip = settings.sip
    if not sip.tls_port or sip.tls_cert_file is None or sip.tls_key_file is None:
        return []  # off, or config.settings already refused the missing file
    problems = [
        p
        for p in (
            _unreadable("sip.tls_cert_file", sip.tls_cert_file),
            _unreadable("sip.tls_key_file", sip.tls_key_file),
        )
        if p
    ]
    if problems:
        return problems
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(sip.tls_cert_file), str(sip.tls_key_file))
    except ssl.SSLError as exc:
        return [_describe(exc, sip.tls_cert_file, sip.tls_key_file)]
    return []


def _unreadable(name: str, path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        return f'{name} = "{path}": cannot be read ({exc.strerror}): make it readable by voicegate'
    return ""


def _describe(exc: ssl.SSLError, cert: Path, key: Path) -> str:
    # OpenSSL's reason codes: KEY_VALUES_MISMATCH when the key is not the certificate's; a PEM
    # or ASN.1 error when either file is not what it should be; the library does not say which.
    reason = str(exc.reason or exc)
    if "KEY_VALUES_MISMATCH" in reason:
        return (
            f'sip.tls_key_file = "{key}": the key does not match sip.tls_cert_file = "{cert}": '
            "give the private key of that certificate"
        )
    return (
        f'sip.tls_cert_file = "{cert}", sip.tls_key_file = "{key}": not a PEM certificate and '
        f"its unencrypted PEM private key ({reason}): convert them to PEM (openssl x509 / "
        "openssl pkey), without a pass phrase"
    )
