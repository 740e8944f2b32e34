"""The evaluator: everything that runs or inspects untrusted candidate code lives in this subpackage."""
