"""Tests that drive an installed vLLM (marked ``live``): run inside each vLLM environment
(scripts/test.sh), where under ``CI=true`` none may skip."""
