"""The seed's lazy MLP training loop (4 x [Linear(w, w) + ReLU] + classifier, batch 64) on mncore.

Only the import and init lines differ from ordinary PyTorch. Prints the losses and the metrics.
"""
import argparse

import torch

import mncore as torch_mncore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="pfvm:cpu", help="pfvm:cpu or pfvm:cuda[:N]")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    torch_mncore.init(args.device)
    torch.manual_seed(0)
    w = args.width
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(w, w), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(w, 10)).mncore()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = [{"x": torch.randn(64, w), "y": torch.randint(0, 10, (64,))} for _ in range(args.steps)]

    losses = []
    for batch in train_loader:
        x, y = batch["x"].mncore(), batch["y"].mncore()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        torch_mncore.sync()
        losses.append(loss)
    torch_mncore.wait_device_ops()
    for i, loss in enumerate(losses):
        print(f"step {i:3d}  loss {loss.item():.4f}")
    print(torch_mncore.metrics.report())


if __name__ == "__main__":
    main()
