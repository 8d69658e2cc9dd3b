"""The file email backend in a folder of a test's own, on every supported Django."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import django

FILE_BACKEND = "django.core.mail.backends.filebased.EmailBackend"


def file_mail(settings: Any, folder: Path | str) -> None:
    if django.VERSION >= (6, 1):  # Django 6.1 replaced EMAIL_BACKEND/EMAIL_FILE_PATH
        options = {"file_path": str(folder)}
        settings.MAILERS = {"default": {"BACKEND": FILE_BACKEND, "OPTIONS": options}}
    else:
        settings.EMAIL_BACKEND = FILE_BACKEND
        settings.EMAIL_FILE_PATH = str(folder)
