"""Create the laptop set-up's secret key file once, before Django starts: settings read it when SECRET_KEY is not
set, and with DEBUG off (the default) they refuse to start without one.

    python -m feedback_app.secret_key        # writes TANDEM_DATA_DIR/secret_key (mode 600) unless it exists
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def ensure_secret_key_file(path: Path) -> bool:
    """Write a new random key to `path` unless it exists; True when one was written."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(secrets.token_urlsafe(50))
    return True


def main() -> None:
    from feedback_app.env import env_path

    data_dir = env_path("TANDEM_DATA_DIR", Path(__file__).resolve().parent.parent / "var")
    path = data_dir / "secret_key"
    print(f"Secret key {'generated' if ensure_secret_key_file(path) else 'kept'}: {path}")


if __name__ == "__main__":
    main()
