"""`pipeline client` argument checks: --max-tokens < 1 and a URL scheme on the gRPC address are refused locally
(exit 2, naming the flag) instead of reaching the server or reporting "no server"."""

from __future__ import annotations

import pytest

from pipeline.serve.client_cli import main
from pipeline.serve.server import free_port


@pytest.mark.parametrize("value", ["0", "-2"])
def test_max_tokens_below_one_is_exit_2_naming_the_flag(capsys, value):
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", "--max-tokens", value, "hi"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--max-tokens={value}" in err and ">= 1" in err


def test_max_tokens_via_input_is_checked_too(capsys):
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", "--input", "max_tokens=0", "hi"])
    assert rc == 2 and "--input max_tokens=0" in capsys.readouterr().err


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_http_scheme_on_the_grpc_url_is_exit_2_with_the_fix(capsys, scheme):
    port = free_port()
    rc = main(["--url", f"{scheme}://127.0.0.1:{port}", "--raw", "hi"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "host:port without a scheme" in err and f"--url 127.0.0.1:{port}" in err
    assert "no Triton server answers" not in err


def test_grpc_scheme_is_stripped(capsys):
    port = free_port()
    rc = main(["--url", f"grpc://127.0.0.1:{port}", "--raw", "hi"])
    err = capsys.readouterr().err
    assert rc == 4, err  # no server there: the preflight names the stripped address
    assert f"no Triton server answers at 127.0.0.1:{port}" in err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_exit_2_naming_the_flag(capsys, value):
    """``--timeout 0`` was accepted, then every request timed out: exit 1 with "Fix: raise timeout_s"."""
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", "--timeout", value, "hi"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--timeout {value}" in err and "Fix: e.g. --timeout 120" in err and "timeout_s" not in err
    assert "no Triton server answers" not in err  # refused before the preflight


@pytest.mark.parametrize(
    "status,msg,exit_code",
    [
        (None, "onnxruntime_genai: beam_width=2 is outside this deployment's range 1..1", 2),  # streamed: no status
        ("StatusCode.INVALID_ARGUMENT", "unexpected inference input 'x'", 2),  # gRPC unary
        ("400", "onnxruntime_genai: bad_words is not supported", 2),  # HTTP
        ("StatusCode.INTERNAL", "onnxruntime_genai: something broke", 1),
        (None, "onnxruntime_genai: engine error: injected fault", 1),  # the engine failed the request
        ("400", "Failed to process the request(s) for model 'ensemble_0_0', message: Stub process 'x' is not healthy.", 1),
        ("StatusCode.UNAVAILABLE", "Socket closed", 4),
    ],
)
def test_a_request_the_server_refuses_as_invalid_input_is_exit_2(status, msg, exit_code):
    """A refusal of the request's input (INVALID_ARG: gRPC INVALID_ARGUMENT, HTTP 400; a streamed error, which carries
    no status) is the user's input error; a failed engine or an internal error stays exit 1, though Triton 2.51
    answers a dead backend process with a 400 too."""
    from tritonclient.utils import InferenceServerException

    from pipeline.serve.client import RequestError, _classify

    e = _classify(InferenceServerException(msg=msg, status=status), "127.0.0.1:1")
    assert e.exit_code == exit_code, (e, type(e))
    if exit_code != 4:
        assert isinstance(e, RequestError) and e.status == status


@pytest.mark.parametrize(
    "args,both,fix",
    [
        (
            ["--input", "max_tokens=2", "--max-tokens", "5"],
            "--input max_tokens=2 and --max-tokens 5",
            "--max-tokens 5, or --input max_tokens=2",
        ),
        (
            ["--max-tokens", "64", "--input", "max_tokens=2"],
            "--input max_tokens=2 and --max-tokens 64",
            "--max-tokens 64, or",
        ),  # the default, given
        (["--input", "stream=false", "--stream"], "--input stream=false and --stream", "--stream, or --input stream=false without"),
    ],
)
def test_an_input_that_a_flag_given_also_sets_is_exit_2_naming_both(capsys, args, both, fix):
    """``--input max_tokens=2 --max-tokens 5`` sent 2 tokens and dropped --max-tokens without a word (fresh-user trial);
    refused before anything is sent (no server here: the refusal comes before the preflight's exit 4)."""
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", *args, "hi"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert both in err and "only one value can be sent" in err and f"Fix: use one of them ({fix}" in err, err


@pytest.mark.parametrize("item", ["max_tokens=2", "stream=true"])
def test_an_input_whose_flag_is_left_at_its_default_is_no_conflict(capsys, item):
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", "--input", item, "hi"])
    err = capsys.readouterr().err
    assert rc == 4 and "no Triton server answers" in err, err  # accepted: the request got as far as the preflight


@pytest.mark.parametrize("item,named", [("temperature", "--input temperature=<value>, "), ("=0.7", ""), ("", "")])
def test_an_input_without_name_and_value_says_name_value_with_an_example(capsys, item, named):
    """``--input temperature`` (no ``=``) reached the server as temperature='' and came back as "input 'temperature'
    (FP32, shape [1]) expects numbers, got ['']"."""
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", "--input", item, "hi"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--input {item!r}: expected NAME=VALUE" in err and f"Fix: {named}e.g. --input temperature=0.7" in err, err


def test_an_input_given_twice_is_exit_2_naming_both(capsys):
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", "--input", "top_k=1", "--input", "top_k=40", "hi"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "--input top_k=1 and --input top_k=40: both set the top_k input" in err and "Fix: give --input top_k=... once" in err


def test_a_stream_input_that_is_not_true_or_false_is_exit_2(capsys):
    """``--input stream=no`` was sent as stream=True (``bool("no")``)."""
    rc = main(["--url", f"127.0.0.1:{free_port()}", "--raw", "--input", "stream=no", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "--input stream=no: stream is true or false" in err, err


def test_ports_in_use_are_all_named_by_their_config_field_in_one_refusal():
    """Two endpoints' ports taken (another server running): one InputError names both, each with the override that
    `pipeline serve` accepts (package.<endpoint>_port=0), not a bare name (fresh-user trial)."""
    import socket

    import pytest

    from pipeline.errors import InputError
    from pipeline.serve.server import resolve_ports

    busy = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for s in busy:
            s.bind(("127.0.0.1", 0))
            s.listen()
        g, h = (s.getsockname()[1] for s in busy)
        with pytest.raises(InputError) as ei:
            resolve_ports(g, h, 0, "127.0.0.1")
        msg = str(ei.value)
        assert f"package.grpc_port={g}: cannot bind" in msg and f"package.http_port={h}: cannot bind" in msg, msg
        assert "pass package.grpc_port=0" in msg and "pass package.http_port=0" in msg
        assert resolve_ports(0, 0, 0, "127.0.0.1")[0] not in (g, h)
    finally:
        for s in busy:
            s.close()
