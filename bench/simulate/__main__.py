from bench.simulate.cli import app

app(prog_name="python -m bench.simulate")
