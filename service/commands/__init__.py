"""One module per control-plane command, each exposing the ``main(argv) -> int`` that ``tokenmill <command>``
calls (``service.cli.DELEGATES``); the commands themselves live in :mod:`service.client`."""
