"""temper.cli: the `temper` command.

`main.py` parses and dispatches (a `TemperError` is one line and exit 2),
`overrides.py` reads dotted ``--section.key=value`` flags, `train.py` is
``temper train`` (and a launched rank's trainer loop), `eval.py` is ``temper
eval`` / ``temper generate``, `serve.py` is ``temper serve`` / ``temper
serve-rm``, `export.py` is ``temper export`` (a LoRA checkpoint as a merged model).
Heavy modules are imported only by the command that needs them.
"""
