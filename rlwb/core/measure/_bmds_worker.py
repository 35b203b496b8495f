"""Runs EPA's BMDS engine (pybmds) for `benchmark_dose.bmds_fit`, inside the pybmds environment (.venvs/bmds), not
the kernel's: pybmds pins pandas < 3. Standalone (imports nothing of rlwb). Reads one JSON request on stdin
({"datasets": [{doses, ns, means, stdevs}], "bmr", "bmr_type", "models": [BMDS model names]}), writes one JSON line:
per data set, each model's BMD, BMDL, BMDU, AIC, log-likelihood, test-4 p, parameters, and the model BMDS's
recommender picks. Settings: a decreasing curve, normal errors with constant variance, BMDS's default
(frequentist restricted) priors."""

import json
import math
import sys


def main() -> None:
    import pybmds
    from pybmds.constants import DistType
    from pybmds.types.continuous import ContinuousRiskType

    req = json.loads(sys.stdin.read())
    risk = {"relative": ContinuousRiskType.RelativeDeviation,
            "absolute": ContinuousRiskType.AbsoluteDeviation}[req.get("bmr_type", "relative")]
    ctor = {"Linear": pybmds.Models.Linear, "Power": pybmds.Models.Power, "Exponential 3":
            pybmds.Models.ExponentialM3, "Exponential 5": pybmds.Models.ExponentialM5, "Hill": pybmds.Models.Hill}
    out = []
    for g in req["datasets"]:
        try:  # BMDS refuses fewer than 3 dose groups: said so for that data set, the others still run
            ds = pybmds.ContinuousDataset(doses=g["doses"], ns=g["ns"], means=g["means"], stdevs=g["stdevs"])
        except ValueError as e:
            out.append({"models": {}, "recommended": None, "error": str(e)})
            continue
        s = pybmds.Session(dataset=ds)
        for name in req["models"]:
            # disttype named: without it pybmds picks constant or non-constant variance from its test 2 per data set
            s.add_model(ctor[name], settings={"bmr_type": risk, "bmr": float(req["bmr"]), "is_increasing": False,
                                              "disttype": DistType.normal})
        s.execute()
        s.recommend()
        models = {}
        for m in s.models:
            r = m.results

            def num(v):
                v = float(v)
                return v if math.isfinite(v) else None

            models[m.name()] = {"bmd": num(r.bmd), "bmdl": num(r.bmdl), "bmdu": num(r.bmdu), "aic": num(r.fit.aic),
                                "loglik": num(r.fit.loglikelihood), "gof_p": num(r.tests.p_values[3]),
                                "gof_df": num(r.tests.dfs[3]),
                                "params": dict(zip(r.parameters.names, map(float, r.parameters.values)))}
        i = s.recommender.results.recommended_model_index
        out.append({"models": models, "recommended": s.models[i].name() if i is not None else None})
    sys.stdout.write("\n" + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
