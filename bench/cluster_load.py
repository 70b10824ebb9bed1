"""The MQTT generator (mqtt_load.py, unchanged) with its publishers and
subscribers spread over several nodes of one cluster.

    cluster_load.py <mqtt_load.py arguments> --pub-ports 29901 --sub-ports 29902,29901

Each publisher and subscriber worker process connects to the next port of its side's list, in turn;
``--port`` still names the node whose CPU and memory the generator records.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl
import mqtt_load


def take_ports(argv: list[str], option: str) -> list[int]:
    if option not in argv:
        return []
    at = argv.index(option)
    ports = [int(p) for p in argv[at + 1].split(",")]
    del argv[at : at + 2]
    return ports


def main() -> None:
    argv = sys.argv[1:]
    pub_ports = take_ports(argv, "--pub-ports")
    sub_ports = take_ports(argv, "--sub-ports")
    spawn = bl.Coordinator.spawn

    def spread(self: Any, fn: Any, wids: list[str], cfgs: list[dict[str, Any]]) -> Any:
        ports = sub_ports if fn is mqtt_load.role_sub else pub_ports if fn is mqtt_load.role_pub else []
        if ports:
            cfgs = [dict(cfg, port=ports[i % len(ports)]) for i, cfg in enumerate(cfgs)]
        return spawn(self, fn, wids, cfgs)

    bl.Coordinator.spawn = spread
    mqtt_load.main(argv)


if __name__ == "__main__":
    main()
