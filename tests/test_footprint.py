"""Bytes a decode step reads: the physical limit every speed figure is reported against."""

from river_core.contract.footprint import Footprint

F = Footprint(layer_bytes=(10, 10, 10), stand_in_bytes=(3, 3, 3), kv_projection_bytes=(2, 2, 2),
              head_bytes=5, kv_bytes_per_position=1)


def test_a_token_reads_its_backbone_layers_the_head_and_what_its_strategy_reads_past_the_exit():
    # exit after layer 0 with 4 cached positions
    assert F.bytes_per_token(0, 4, "stand_in") == 10 + 2 * 3 + 5 + 4 * 3   # stand-ins attend too
    assert F.bytes_per_token(0, 4, "kv_projection") == 10 + 2 * 2 + 5 + 4 * 1
    assert F.bytes_per_token(0, 4, "nothing") == 10 + 5 + 4 * 1


def test_full_depth_reads_the_same_whatever_the_strategy():
    full = 30 + 5 + 4 * 3
    assert {F.bytes_per_token(2, 4, r) for r in ("stand_in", "kv_projection", "nothing")} == {full}


def test_a_token_that_left_reads_the_heads_stand_in_when_it_takes_it():
    f = Footprint((10, 10, 10), (3, 3, 3), (2, 2, 2), head_bytes=5, kv_bytes_per_position=1,
                  stand_in_head_bytes=2)
    assert f.bytes_per_token(0, 4, "stand_in", stand_in_head=True) == 10 + 2 * 3 + 2 + 4 * 3
    # at full depth the token takes the model's own head (ExitConfig.exit_head)
    assert f.bytes_per_token(2, 4, stand_in_head=True) == f.bytes_per_token(2, 4)
