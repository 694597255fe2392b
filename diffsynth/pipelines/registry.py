"""placeholder"""
def register_original_layouts() -> None:
    from ..core.original_layouts import register_original_layout
    register_original_layout("diffsynth.pipelines.wan_video.original:identify")
    register_original_layout("diffsynth.pipelines.flux.original:identify")
