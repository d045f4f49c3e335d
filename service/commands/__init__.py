"""One module per ``tokenmill`` command, named as the command (``service.cli.COMMANDS`` lists them with the
commands whose module lives with its feature: ``training.plan``, ``pipeline.card.cli``...). Each has
``build_parser()`` (its options), ``run(args) -> int`` (the command) and ``main(argv) -> int`` (the two); it is
reached through ``service.cli`` only (``tokenmill NAME``, or ``python -m service.cli NAME`` without the entry
point).

What several commands share: :mod:`.exits` (exit codes, ``error:`` lines), :mod:`.http_client` (the HTTP client),
:mod:`.http_command` (``--server``/``--api-key``, a refusal's exit code), :mod:`.store_options` (the state and
database options of ``serve`` and ``apikey``).
"""
