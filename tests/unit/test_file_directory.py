"""The static directory file: what it accepts, and one clear error for what it does not."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gateway.client.directory import Holder
from gateway.client.file_directory import FileDirectory
from gateway.errors import ConfigError, DiscoveryError
from gateway.wire.announce import Channel


def test_toml_and_json_give_the_same_streams(tmp_path: Path) -> None:
    toml = tmp_path / "d.toml"
    toml.write_text(
        '[streams.px]\nchannels = ["udp://239.192.1.11:5011", "epgm://239.192.2.11:5011"]\n'
        'sidecar = "tcp://10.1.0.5:5580"\ningest = "tcp://10.1.0.5:5570"\n[streams.tr]\n'
    )
    as_json = tmp_path / "d.json"
    px = {
        "channels": ["udp://239.192.1.11:5011", "epgm://239.192.2.11:5011"],
        "sidecar": "tcp://10.1.0.5:5580",
        "ingest": "tcp://10.1.0.5:5570",
    }
    as_json.write_text(json.dumps({"streams": {"px": px, "tr": {}}}))
    for path in (toml, as_json):
        with FileDirectory(path) as directory:
            info = directory.wait("px", time.monotonic(), lambda i: bool(i.sidecar))
            assert info.channels == (Channel("udp", "239.192.1.11", 5011), Channel("epgm", "239.192.2.11", 5011))
            assert (info.sidecar, info.ingest) == ("tcp://10.1.0.5:5580", "tcp://10.1.0.5:5570")
            assert [i.name for i in directory.streams()] == ["px", "tr"]
            with pytest.raises(DiscoveryError, match="lacks"):
                directory.wait("tr", time.monotonic() + 10, lambda i: i.ingest is not None)  # at once: nothing moves
            with pytest.raises(DiscoveryError, match="it lists: px, tr"):
                directory.wait("nope", time.monotonic() + 10, lambda i: True)
            assert info.holders == info.authoritative == (Holder(f"file {path.name}"),), "a file without copy: primary"


def test_a_file_says_which_copy_is_served_and_its_source(tmp_path: Path) -> None:
    """Site B's clients read the mirror at B (docs/mirroring.md); after promotion B holds the authoritative copy."""
    path = tmp_path / "b.toml"
    path.write_text(
        '[streams.s1]\nsidecar = "tcp://10.2.0.5:5571"\ncopy = "mirror"\nsource = "tcp://10.1.0.5:5571"\n'
        '[streams.s2]\nsidecar = "tcp://10.2.0.5:5571"\ningest = "tcp://10.2.0.5:5570"\ncopy = "promoted"\n'
        'source = "tcp://10.3.0.5:5571"\n[streams.s3]\ncopy = "mirror"\n'
    )
    with FileDirectory(path) as directory:
        s1, s2, s3 = (directory.lookup(name) for name in ("s1", "s2", "s3"))
    assert s1 is not None and s2 is not None and s3 is not None
    assert s1.holders == (Holder("file b.toml", "mirror", "tcp://10.1.0.5:5571"),)
    assert s1.authoritative == (), "the authoritative copy is at the source"
    assert s2.authoritative == (Holder("file b.toml", "promoted", "tcp://10.3.0.5:5571"),)
    assert s3.holders == (Holder("file b.toml", "mirror", ""),), "a mirror whose source the file does not name"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[streams.px]\ncolour = 1\n", "expected a table of channels, sidecar, ingest"),
        ('[streams.px]\nchannels = ["udp://10.0.0.1:5011"]\n', "channel 'udp://10.0.0.1:5011'"),
        ('[streams.px]\nchannels = "udp://239.1.1.1:1"\n', "channels is a list"),
        ('[streams.px]\nsidecar = "udp://x"\n', "sidecar 'udp://x': expected tcp://HOST:PORT"),
        ('[streams.px]\ncopy = "replica"\n', "copy 'replica': expected one of primary, mirror, promoted"),
        ('[streams.px]\ncopy = "mirror"\nsource = "a:1"\n', "source 'a:1': expected tcp://HOST:PORT"),
        ('[streams.px]\ncopy = "mirror"\nsource = "tcp://a b:1"\n', "source 'tcp://a b:1': expected tcp://"),
        ('[streams.px]\nsource = "tcp://a:1"\n', 'source names a mirror\'s source sidecar: add copy = "mirror"'),
        ('[streams."a b"]\n', "stream 'a b'"),
        ("[px]\n", "expected one table `streams`"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_a_bad_file_is_one_config_error_naming_it(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "d.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"d\.toml") as raised:
        FileDirectory(path)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give an existing file"):
        FileDirectory(tmp_path / "none.toml")
