# The two entry points of the README; the logic lives in scripts/.
.PHONY: demo test

demo:
	scripts/demo.sh

test:
	scripts/test.sh
