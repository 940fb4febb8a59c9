from cookmind.cli import run

run()
