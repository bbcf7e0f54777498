"""conveyor.DataLoader compared with torch.utils.data.DataLoader."""
