"""The demo's report: the WAM against the scripted expert and the random agent on the same episodes, the
imagination scores beside the copy-the-current-frame baseline, the VAE's fit, the timings; written as
report.json and report.md (and imagination_strip.png) in the demo's folder."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import imageio.v3 as iio
import numpy as np

from wam_gym.eval.preflight import CONFIG_FILE
from wam_gym.eval.results import task_slug
from wam_gym.eval.run_files import read_results
from wam_gym.utils.publish import atomic_path
from wam_gym.utils.video import imagination_strip, read_mp4


class DemoReport:
    """The report of one demo folder ``out`` (its config, trained ``checkpoint`` and stage ``timings``)."""

    def __init__(self, config, out: Path, checkpoint: Path, timings: dict[str, float]):
        self.config, self.out, self.checkpoint, self.timings = config, out, checkpoint, timings

    def write(self) -> dict:
        """Read the three evaluations, the paired comparison and the VAE's fit; write report.json and report.md."""
        results = {a: read_results(self.out / "eval" / a / "results.json") for a in ("wam", "expert", "random")}
        paired = self._wam_vs_random()
        rows = []
        for task in self.config.tasks:
            rate = {a: results[a]["tasks"].get(task, {}).get("success_rate") for a in results}
            rows.append({"task": task, **rate, "wam_beats_random": (rate["wam"] or 0) > (rate["random"] or 0),
                         "ci95": {a: results[a]["tasks"].get(task, {}).get("success_rate_ci95") for a in results},
                         "wam_vs_random": (paired or {}).get("tasks", {}).get(task),
                         "imagination": results["wam"]["tasks"].get(task, {}).get("imagination")})
        videos = sorted(str(p.relative_to(self.out)) for p in (self.out / "eval" / "wam" / "videos").rglob("*.mp4"))
        vae = json.loads((self.out / "vae" / "fit_vae.json").read_text())
        report = {
            "config": asdict(self.config),
            "tasks": rows,
            "overall": {a: results[a]["overall"]["success_rate"] for a in results},
            "overall_ci95": {a: results[a]["overall"]["success_rate_ci95"] for a in results},
            # the WAM and the random agent on the same episodes (python -m wam_gym.compare eval/random eval/wam)
            "wam_vs_random": None if paired is None else {"overall": paired["overall"], "verdict": paired["verdict"]},
            "tasks_where_wam_beats_random": sum(r["wam_beats_random"] for r in rows),
            # the WAM's predicted frames vs the frames the env rendered, and the copy-the-current-frame baseline's
            "imagination": results["wam"]["overall"].get("imagination"),
            "vae": {k: vae.get(k) for k in ("held_out_psnr", "mean_image_psnr", "steps", "train_s")},
            "strip": self._strip(results["wam"], videos),
            "broker": results["wam"].get("broker", {}),
            "timings_s": self.timings,
            "outputs": {
                "dataset": "data/", "checkpoint": "train/checkpoint/", "tensorboard": ["train/tensorboard/",
                "eval/wam/tensorboard/"], "videos": videos, "results": [f"eval/{a}/results.json" for a in results],
            },
        }
        (self.out / "report.json").write_text(json.dumps(report, indent=2))
        (self.out / "report.md").write_text(_markdown(report))
        print(_markdown(report))
        print(f"[demo] everything is under {self.out}")
        return report

    def _wam_vs_random(self) -> dict | None:
        """The paired comparison of the random agent (A) and the WAM (B); None for runs that do not pair
        (a demo folder from before both ran in the same envs)."""
        from wam_gym.compare import compare

        try:
            return compare(self.out / "eval" / "random", self.out / "eval" / "wam")
        except ValueError as exc:
            print(f"[demo] no paired comparison: {exc}")
            return None

    def _executed_per_chunk(self) -> int:
        """Actions the WAM executed from each chunk: ``replan_steps``, or its checkpoint's whole chunk."""
        config = json.loads((self.checkpoint / CONFIG_FILE).read_text())
        return self.config.replan_steps or config["action_horizon"]

    def _strip(self, wam: dict, videos: list[str]) -> str | None:
        """imagination_strip.png: per task (its first rollout), the frames the env rendered over
        the frames the WAM imagined for those steps (see wam_gym.utils.video.imagination_strip)."""
        spec = wam.get("imagination")
        if not spec or self._executed_per_chunk() % spec["frame_stride"]:
            return None
        rows = []
        for task in self.config.tasks:
            first = next((v for v in videos if v.split("/")[-2] == task_slug(task)), None)
            if first is not None:
                rows.append(imagination_strip(read_mp4(self.out / first), spec["frame_stride"]))
        if not rows:
            return None
        width = max(r.shape[1] for r in rows)
        gap = np.full((2, width, 3), 255, np.uint8)
        padded = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0))) for r in rows]
        image = np.concatenate([x for r in padded for x in (r, gap)][:-1])
        with atomic_path(self.out / "imagination_strip.png") as tmp:
            iio.imwrite(tmp, image, extension=".png")
        return "imagination_strip.png"


def _markdown(report: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.0f}%"

    def rate(x, ci):
        return pct(x) if ci is None else f"{pct(x)} [{pct(ci[0])}, {pct(ci[1])}]"

    def paired(p):
        if p is None:
            return "-"
        d, (low, high) = p["difference"], p["ci"]
        return f"{100 * d:+.0f} [{100 * low:+.0f}, {100 * high:+.0f}], p={p['mcnemar_p']:.2g}"

    agents = ("wam", "expert", "random")
    lines = ["# wam_gym demo report", "",
             "Success rates with 95% intervals (Wilson per task; overall: the mean of the tasks, MOVER); the last "
             "column pairs the WAM with the random agent episode by episode (points, 95% interval, exact McNemar p).",
             "", "| task | WAM | scripted expert | random | WAM - random (paired) |", "| --- | --- | --- | --- | --- |"]
    for row in report["tasks"]:
        cells = " | ".join(rate(row[a], row.get("ci95", {}).get(a)) for a in agents)
        lines.append(f"| {row['task']} | {cells} | {paired(row.get('wam_vs_random'))} |")
    o, ci, vs = report["overall"], report.get("overall_ci95", {}), report.get("wam_vs_random") or {}
    cells = " | ".join(rate(o[a], ci.get(a)) for a in agents)
    lines += [f"| **overall** | {cells} | {paired(vs.get('overall'))} |", "",
              f"The WAM beats the random agent on {report['tasks_where_wam_beats_random']} of {len(report['tasks'])} tasks"
              + (f"; paired over all {vs['overall']['pairs']} episodes: {paired(vs['overall'])} "
                 f"({vs['overall']['only_a'] + vs['overall']['only_b']} pairs disagree)." if vs else "."),
              "", *_imagination_markdown(report), *_vae_markdown(report), f"Stage times (s): {report['timings_s']}", "",
              "Outputs: dataset `data/`, checkpoint `train/checkpoint/`, tensorboard `train/tensorboard/` "
              "(`tensorboard --logdir " + "train/tensorboard`), rollout videos with predicted frames beside them:"]
    videos = report["outputs"]["videos"]
    if videos:  # one per episode: name the folder and the first, not forty lines
        lines.append(f"{len(videos)} under `eval/wam/videos/<task>/<trial>.mp4`, e.g. `{videos[0]}`")
    return "\n".join(lines) + "\n"


def _imagination_markdown(report: dict) -> list[str]:
    """The imagination score per task: the WAM's predicted frames vs the copy-the-current-frame predictor."""
    if not report.get("imagination"):
        return []

    def cell(scores, key, spec):
        value = (scores or {}).get(key)
        return "-" if value is None else format(value, spec)

    lines = ["Imagination score: the WAM's predicted future frames against the frames the env then rendered "
             "(PSNR dB / SSIM, mean over replans and episodes), beside copying the current frame as the prediction:",
             "", "| task | WAM PSNR | copy PSNR | WAM SSIM | copy SSIM | frames scored |",
             "| --- | --- | --- | --- | --- | --- |"]
    named = [(row["task"], row.get("imagination")) for row in report["tasks"]]
    for name, scores in [*named, ("**overall**", report["imagination"])]:
        lines.append(f"| {name} | {cell(scores, 'imagine_psnr', '.2f')} | {cell(scores, 'copy_psnr', '.2f')} | "
                     f"{cell(scores, 'imagine_ssim', '.3f')} | {cell(scores, 'copy_ssim', '.3f')} | "
                     f"{(scores or {}).get('frames', 0)} |")
    better = sum(1 for _, s in named if s and s.get("imagine_psnr") is not None
                 and s.get("copy_psnr") is not None and s["imagine_psnr"] > s["copy_psnr"])
    lines += ["", f"The WAM's imagination beats copying the current frame (PSNR) on {better} of {len(named)} tasks.", ""]
    if report.get("strip"):
        lines += ["Per task (its first rollout), the frames the env rendered (top) over what the WAM imagined "
                  "for those steps one replan stride earlier (bottom):", "", f"![real vs imagined]({report['strip']})", ""]
    return lines


def _vae_markdown(report: dict) -> list[str]:
    vae = report.get("vae") or {}
    if vae.get("held_out_psnr") is None:
        return []
    return [f"The VAE (`vae/`, {vae['steps']} steps, {vae['train_s']:.0f} s) reconstructs held-out demo clips at "
            f"{vae['held_out_psnr']:.1f} dB PSNR; predicting the mean image scores {vae['mean_image_psnr']:.1f} dB.", ""]


