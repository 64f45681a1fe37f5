"""What a scenario file says: the cluster's network, the training job, the claims about its
run, and the sweeps over them. Typed and validated at load time; nothing here builds or runs."""

from netsim_ddp.scenario.spec import (
    BackgroundFlow,
    EffectiveLink,
    Scenario,
    ScenarioError,
    Topology,
    point_label,
)

__all__ = ["BackgroundFlow", "EffectiveLink", "Scenario", "ScenarioError", "Topology",
           "point_label"]


def __getattr__(name: str):
    # `netsim_ddp.scenario` was one module before 0.2: its other names, for one release.
    from netsim_ddp.scenario import spec

    if hasattr(spec, name) and not name.startswith("_"):
        import warnings

        warnings.warn(f"netsim_ddp.scenario.{name} has moved to netsim_ddp.scenario.spec.{name}",
                      DeprecationWarning, stacklevel=2)
        return getattr(spec, name)
    raise AttributeError(name)
