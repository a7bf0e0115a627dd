from cachedoctor.cli import run

run()
