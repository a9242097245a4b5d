"""Step 2: plain torch FSDP2 (fully_shard) over a PEFT LoRA of tiny-qwen2 on CPU/gloo; one step, DCP sharded save,
full_tensor() gather of the LoRA weights on every rank."""
import hashlib, os, sys, time, traceback
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, FSDPModule
from torch.distributed.tensor import DTensor
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model

MODEL = "/opt/grpo-deploy/models/tiny-qwen2"
dist.init_process_group("gloo")
rank, ws = dist.get_rank(), dist.get_world_size()
def p(*a): print(f"[rank{rank}]", *a, flush=True)
p("torch", torch.__version__, "backend", dist.get_backend(), "ws", ws, "MASTER_ADDR", os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
p("tied:", model.lm_head.weight is model.model.embed_tokens.weight)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0))
mesh = init_device_mesh("cpu", (ws,))
layers = model.base_model.model.model.layers
for layer in layers:
    fully_shard(layer, mesh=mesh, reshard_after_forward=False)
fully_shard(model, mesh=mesh, reshard_after_forward=False)
p("fsdp wrapped:", isinstance(model, FSDPModule), "tied after shard:", model.base_model.model.lm_head.weight is model.base_model.model.model.embed_tokens.weight)
trainable = [(n, q) for n, q in model.named_parameters() if q.requires_grad]
p("trainable", len(trainable), "first", trainable[0][0], type(trainable[0][1]).__name__, "local", tuple(trainable[0][1].to_local().shape), "global", tuple(trainable[0][1].shape))
opt = torch.optim.AdamW([q for _, q in trainable], lr=1e-2)
ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(rank))
t = time.time()
out = model(input_ids=ids, labels=ids)
out.loss.backward()
opt.step(); opt.zero_grad()
p(f"step ok loss={out.loss.item():.4f} in {time.time()-t:.2f}s")
# sharded save (DCP)
sd = get_model_state_dict(model, options=StateDictOptions())
lora_sd = {k: v for k, v in sd.items() if "lora_" in k}
p("state dict entries", len(sd), "lora", len(lora_sd), "types", {type(v).__name__ for v in sd.values()})
dcp.save(sd, checkpoint_id="/work/ckpt_torch")
p("dcp.save ok:", sorted(os.listdir("/work/ckpt_torch")))
# full_tensor gather of LoRA weights on every rank
h = hashlib.sha256()
for k in sorted(lora_sd):
    v = lora_sd[k]
    full = v.full_tensor() if isinstance(v, DTensor) else v
    h.update(k.encode()); h.update(full.detach().cpu().contiguous().numpy().tobytes())
p("lora full_tensor digest", h.hexdigest()[:16], "n", len(lora_sd))
digests = [None] * ws
dist.all_gather_object(digests, h.hexdigest())
p("digests agree across ranks:", len(set(digests)) == 1)
# load back the sharded checkpoint
sd2 = get_model_state_dict(model)
dcp.load(sd2, checkpoint_id="/work/ckpt_torch")
p("dcp.load ok")
dist.barrier(); dist.destroy_process_group()
p("DONE")
