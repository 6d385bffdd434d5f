"""Writes EasyR1/verl-format actor checkpoints the way EasyR1 does: each rank torch.saves the
sharded state dict (DTensors) of its FSDP2 model as model_world_size_W_rank_R.pt, rank 0 writes
huggingface/ (config, tokenizer). Run: python easyr1_shards.py MODEL OUT WORLD MESH"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, model_path: str, out: str, mesh_kind: str, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():  # weights unlike the base model's, so the merge has something to prove
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    if mesh_kind == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("ddp", "fsdp"))
    elif mesh_kind == "tp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = get_model_state_dict(model, options=StateDictOptions(cpu_offload=True))
    actor = os.path.join(out, "global_step_2", "actor")
    os.makedirs(actor, exist_ok=True)
    torch.save(state, os.path.join(actor, f"model_world_size_{world}_rank_{rank}.pt"))
    if rank == 0:
        hf = os.path.join(actor, "huggingface")
        model.config.save_pretrained(hf)
        AutoTokenizer.from_pretrained(model_path).save_pretrained(hf)
        torch.save(full, os.path.join(out, "reference_full.pt"))
        tracker = {
            "best_global_step": None,
            "best_val_reward_score": None,
            "last_global_step": 2,
            "last_actor_path": actor,
        }
        with open(os.path.join(out, "checkpoint_tracker.json"), "w") as f:
            json.dump(tracker, f)
        with open(os.path.join(out, "experiment_log.jsonl"), "w") as f:
            f.write('{"step": 2, "reward": {"overall": 0.25}, "val": {"reward_score": 0.5}}\n')
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    model_path, out, world, mesh_kind = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    os.makedirs(out, exist_ok=True)  # the rendezvous file (no port: one found free could be taken)
    mp.spawn(worker, args=(world, model_path, out, mesh_kind, os.path.join(out, ".rendezvous")), nprocs=world)
