"""lm-evaluation-harness for Halyard models (needs ``pip install lm-eval``).

```python
from halyard.train.harness import HalyardLM, evaluate_tasks

lm = HalyardLM.from_run("runs/demo", batch_size=16)      # or HalyardLM.from_hf(folder), HalyardLM(model, tok)
results = evaluate_tasks(lm, ["hellaswag"], limit=100)   # lm-eval's results dict
print(results["results"]["hellaswag"]["acc,none"])
```

Importing this package registers the model with lm-eval as ``halyard``, so
``lm_eval.simple_evaluate(model="halyard", model_args="run=runs/demo", tasks=[...])`` works too.
"""

from halyard.train.harness.model import HalyardLM
from halyard.train.harness.results import write_results
from halyard.train.harness.tasks import evaluate_tasks

__all__ = ["HalyardLM", "evaluate_tasks", "write_results"]
