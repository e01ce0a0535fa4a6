//! The benchmark preset shared by the benches.

use tpgrpo::model::MMDiTConfig;

/// 4 blocks, 4 heads x 64 (D = 256), dual attention on blocks 0-1, qk-norm, text width 256,
/// pooled 128, position grid 32 (latents 16x32x32 give 256 image tokens).
pub fn bench_config() -> MMDiTConfig {
    MMDiTConfig::new()
        .with_sample_size(32)
        .with_num_layers(4)
        .with_num_attention_heads(4)
        .with_attention_head_dim(64)
        .with_joint_attention_dim(256)
        .with_caption_projection_dim(256)
        .with_pooled_projection_dim(128)
        .with_pos_embed_max_size(32)
        .with_dual_attention_layers(vec![0, 1])
        .with_qk_norm(Some("rms_norm".into()))
}
