"""Pictures and videos in prompts: opening and placing images (vision), sampling and processing
videos (video), and Qwen-VL processors without torchvision (compat)."""
