"""The seed's Context-API MLP training program; only the import line (and device) differ from MLSDK."""
import torch
from mncore.context import CacheOptions, Context, MNDevice, set_tensor_name_in_module, storage

torch.manual_seed(0)
train_loader = [{"x": torch.randn(64, 512), "y": torch.randint(0, 10, (64,))} for _ in range(20)]

device = MNDevice("pfvm:cpu")
context = Context(device)
Context.switch_context(context)

model = torch.nn.Sequential(
    torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# parameter と buffer は名前を付けて Context に静的に登録する
set_tensor_name_in_module(model, "model")
for p in model.parameters():
    context.register_param(p)
for b in model.buffers():
    context.register_buffer(b)


# コンパイル対象を dict -> dict の関数に閉じ込める
def train_step(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
    loss.backward()
    optimizer.step()
    return {"loss": loss}


# サンプル入力を与えてコンパイルする
sample_input = next(iter(train_loader))
compiled_step = context.compile(
    train_step,
    sample_input,
    storage.path("/tmp/mlp_train"),
    cache_options=CacheOptions("/tmp/mlp_train_cache"),
)

for batch in train_loader:
    out = compiled_step(batch)
print("last loss", out["loss"].item())
context.synchronize()
print(model[2].bias)
