"""scripts/install.sh derives the Debian backports source from the machine's own apt sources
(``--backports-source APT_DIR OS_RELEASE`` prints the line it would write; nothing is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "install.sh"
KEY = "/usr/share/keyrings/debian-archive-keyring.gpg"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")


def derive(tmp_path: Path, files: dict[str, str], codename: str | None = "bookworm") -> subprocess.CompletedProcess:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (apt / name).write_text(text)
    os_release = tmp_path / "os-release"
    os_release.write_text('NAME="Debian GNU/Linux"\n' + (f"VERSION_CODENAME={codename}\n" if codename else ""))
    return subprocess.run(["bash", str(SCRIPT), "--backports-source", str(apt), str(os_release)],
                          capture_output=True, text=True, timeout=60)


def line(tmp_path, files, codename="bookworm") -> str:
    result = derive(tmp_path, files, codename)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


DEB822 = f"""Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: {KEY}

Types: deb
URIs: http://mirror.example.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: {KEY}
"""


def test_deb822_sources_give_the_same_mirror_and_key(tmp_path):
    files = {
        "sources.list.d/debian.sources": DEB822,
        "sources.list.d/vendor.list": "deb https://vendor.example.com/apt cloud-sdk-bookworm main\n",
        "sources.list.d/node.sources": "Types: deb\nURIs: https://node.example.com/node_20\nSuites: nodistro\nComponents: main\n",
        "sources.list.d/old.sources.disabled": "Types: deb\nURIs: http://wrong.example/debian\nSuites: bookworm\n",
    }
    assert line(tmp_path, files) == f"deb [signed-by={KEY}] http://mirror.example.org/debian bookworm-backports main"


def test_one_line_sources_keep_their_options(tmp_path):
    sources = (
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb http://mirror.example.net/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/k.gpg] https://mirror.example.net/debian/ bookworm main contrib  # main\n"
    )
    assert line(tmp_path, {"sources.list": sources}) == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/k.gpg] https://mirror.example.net/debian/ bookworm-backports main"
    )
    spaced = "deb [ arch=amd64 ] http://m.example/debian trixie main\n"
    want = "deb [arch=amd64] http://m.example/debian trixie-backports main"
    assert line(tmp_path / "t", {"sources.list": spaced}, "trixie") == want


def test_disabled_stanzas_and_inline_keys(tmp_path):
    sources = (
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n"
        "Types: deb deb-src\nURIs: http://on.example/debian http://second.example/debian\nSuites: bookworm\n"
        "Components: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBF...\n"
    )
    # An inline key cannot be named in a one-line entry: the line leaves it to apt's trusted keys.
    assert line(tmp_path, {"sources.list.d/debian.sources": sources}) == "deb http://on.example/debian bookworm-backports main"


def test_no_debian_source_or_codename_fails_with_a_reason(tmp_path):
    result = derive(tmp_path, {"sources.list": "deb https://vendor.example.com/apt stable main\n"})
    assert result.returncode != 0 and result.stdout == "" and "no apt source for Debian bookworm" in result.stderr
    result = derive(tmp_path / "x", {"sources.list.d/debian.sources": DEB822}, codename=None)
    assert result.returncode != 0 and "VERSION_CODENAME" in result.stderr


def test_this_machine_if_debian(tmp_path):
    os_release = Path("/etc/os-release")
    if not Path("/etc/apt").is_dir() or "VERSION_CODENAME" not in (os_release.read_text() if os_release.exists() else ""):
        pytest.skip("not a Debian-like machine")
    result = subprocess.run(["bash", str(SCRIPT), "--backports-source"], capture_output=True, text=True, timeout=60)
    if result.returncode == 0:
        assert result.stdout.startswith("deb ") and "-backports main" in result.stdout


def test_the_script_names_no_mirror():
    assert "://" not in SCRIPT.read_text()
