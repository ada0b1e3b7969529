"""A torch MLP in two pipeline stages, zero-bubble schedule (docs/PYTHON.md):
    pptrain run --nproc 2 python3 01_two_stage_mlp.py   (or: python3 01_two_stage_mlp.py)"""
import torch

import pptrain

torch.manual_seed(0)  # every rank builds the same model
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
num_stages, mine = pptrain.placement("zb-h1", 4)  # 2 stages on 2 ranks, 1 on one
parts = pptrain.split(model, [2] if num_stages == 2 else [])
stages = [pptrain.PipelineStage(parts[s], s, num_stages) for s in mine]
schedule = pptrain.schedule("zb-h1", stages, n_microbatches=4,
                            loss_fn=torch.nn.functional.mse_loss)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)
for step in range(5):
    optimizer.zero_grad()
    loss = schedule.step(x, target=y)  # the mean loss, on the last stage's rank
    optimizer.step()  # the gradients are in the model's own parameters
    if loss is not None:
        print(f"step {step} loss {float(loss):.8f}")
