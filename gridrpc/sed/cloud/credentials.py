"""AWS credentials for the cloud providers, found the way the AWS CLI finds
them (an explicit profile, the environment, then the shared credentials
file), never in a deployment file. Used by
:class:`~gridrpc.sed.cloud.libcloud_ec2.LibcloudProvider`."""
from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .provider_api import CloudAuthError

__all__ = ["Credentials", "resolve_aws_credentials", "secret_keys"]

# key_name is an SSH key pair's *name*, not a secret
_SECRET_KEY = re.compile(r"(secret|password|passwd|token|access_key|key_id|api_key)", re.I)


@dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)
    source: str = ""  # where they came from, for error messages (never the secret)


def resolve_aws_credentials(*, profile: str | None = None,
                            environ: Mapping[str, str] | None = None) -> Credentials:
    """Find AWS credentials the way the AWS CLI does, minus instance metadata.

    1. an explicit ``profile`` -> that section of the shared credentials file;
    2. ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``);
    3. the ``AWS_PROFILE`` (else ``default``) section of
       ``AWS_SHARED_CREDENTIALS_FILE`` (else ``~/.aws/credentials``).
    """
    env = os.environ if environ is None else environ
    if profile is None and env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return Credentials(access_key=env["AWS_ACCESS_KEY_ID"],
                           secret_key=env["AWS_SECRET_ACCESS_KEY"],
                           token=env.get("AWS_SESSION_TOKEN") or None,
                           source="environment (AWS_ACCESS_KEY_ID)")
    section = profile or env.get("AWS_PROFILE") or "default"
    path = env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".aws", "credentials")
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(os.path.expanduser(path), encoding="utf-8")
    except (OSError, configparser.Error) as exc:
        raise CloudAuthError(f"cannot read AWS credentials file {path}: {exc}") from exc
    if parser.has_section(section):
        sect = parser[section]
        key, secret = sect.get("aws_access_key_id"), sect.get("aws_secret_access_key")
        if key and secret:
            return Credentials(access_key=key.strip(), secret_key=secret.strip(),
                               token=(sect.get("aws_session_token") or "").strip() or None,
                               source=f"{path} [{section}]")
        raise CloudAuthError(f"profile [{section}] in {path} lacks "
                             "aws_access_key_id/aws_secret_access_key")
    raise CloudAuthError(
        f"no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
        f"or add a [{section}] profile to {path}")


def secret_keys(settings: Mapping) -> list[str]:
    """The keys of *settings* that name a credential (``secret_key``,
    ``password``, ``token``...), sorted: refused in configuration and
    deployment files, whose credentials come from the environment or
    ``~/.aws/credentials``. ``key_name`` (an SSH key pair's name) is not one."""
    return sorted(str(k) for k in settings if _SECRET_KEY.search(str(k)) and k != "key_name")
