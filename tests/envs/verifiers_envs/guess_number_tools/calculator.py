"""A calculator tool server, launched once per rollout."""

import verifiers.v1 as vf


class CalculatorToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Return a + b."""
        return a + b


if __name__ == "__main__":
    CalculatorToolset.run()
